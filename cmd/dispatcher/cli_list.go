package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/browse"
	"github.com/dispatcher/dispatcher/internal/glob"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

// maxLimit bounds --limit: a page is held in memory and printed at once.
const maxLimit = 100_000

// pageFlags are the flags of a paged listing (list, dead list).
type pageFlags struct {
	shardIdx       int
	from, to       string
	match, after   string
	limit, maxScan int
	fs             *pflag.FlagSet // to tell --to "" from no --to
}

func (p *pageFlags) add(fs *pflag.FlagSet, times bool) {
	p.fs = fs
	fs.IntVar(&p.shardIdx, "shard", -1, "only shard `i` (default: every shard)")
	if times {
		fs.StringVar(&p.from, "from", "", "only tasks due at or after `T`: "+timeHelp)
		fs.StringVar(&p.to, "to", "", "only tasks due at or before `T`")
	}
	fs.StringVar(&p.match, "match", "", "only tasks whose member (task id, or body if none) matches `GLOB` (Redis's MATCH: * ? [a-z] \\x; ASCII range ends)")
	fs.IntVar(&p.limit, "limit", browse.DefaultLimit, "at most `N` tasks, then the cursor to go on with")
	fs.StringVar(&p.after, "after", "", "go on after `CURSOR`, printed by the page before")
	fs.IntVar(&p.maxScan, "max-scan", browse.DefaultBudget, "look at most at `N` tasks (matching or not), then stop with a cursor")
}

// query makes the walk of the flags (checkLocal checked them), checking
// --shard against the queue.
func (p *pageFlags) query(ctx context.Context, se *session, q config.Queue, state browse.State, now time.Time) (browse.Query, error) {
	aq := se.adminQueue(q)
	bq := browse.Query{Keys: aq.Keys, State: state, Match: p.match, Limit: p.limit, Budget: p.maxScan}
	// Pending shards beyond the count that hold tasks (a producer hashing
	// with a larger count wrote them) are listed too, and may be asked for.
	var beyond []int
	if state == browse.Pending {
		var err error
		if beyond, err = shard.Beyond(ctx, se.rdb, aq.Keys.Pending, aq.Shards); err != nil {
			return bq, se.redisFailure(err)
		}
	}
	if p.shardIdx < -1 || (p.shardIdx >= aq.Shards && !slices.Contains(beyond, p.shardIdx)) {
		return bq, usageErrorf("--shard %d: queue %s has shards 0 to %d", p.shardIdx, q.Name, aq.Shards-1)
	}
	if p.shardIdx >= 0 {
		bq.Shards = []int{p.shardIdx}
	} else {
		for i := range aq.Shards {
			bq.Shards = append(bq.Shards, i)
		}
		bq.Shards = append(bq.Shards, beyond...)
	}
	for _, f := range []struct {
		name, v string
		dst     **int64
	}{{"from", p.from, &bq.From}, {"to", p.to, &bq.To}} {
		if f.v == "" {
			continue
		}
		ms, err := parseTime(f.name, f.v, now)
		if err != nil {
			return bq, err
		}
		*f.dst = &ms
	}
	if bq.From != nil && bq.To != nil && *bq.From > *bq.To {
		return bq, usageErrorf("--from %q is after --to %q", p.from, p.to)
	}
	if p.after != "" {
		c, err := browse.ParseCursor(p.after)
		if err != nil {
			return bq, usageErrorf("--after %q: %v", p.after, err)
		}
		bq.After = &c
	}
	return bq, nil
}

// checkLocal refuses what the flags alone show wrong, before Redis is
// opened.
func (p *pageFlags) checkLocal(state browse.State) error {
	if p.limit < 1 || p.limit > maxLimit {
		return usageErrorf("--limit %d: want 1 to %d", p.limit, maxLimit)
	}
	if p.maxScan < 1 {
		return usageErrorf("--max-scan %d: want 1 or more", p.maxScan)
	}
	for _, f := range [][2]string{{"from", p.from}, {"to", p.to}} {
		if f[1] != "" || p.fs.Changed(f[0]) {
			if _, err := parseTime(f[0], f[1], time.Now()); err != nil {
				return err
			}
		}
	}
	if err := glob.Check(p.match); err != nil {
		return usageErrorf("--match: %v", err)
	}
	if p.after != "" {
		c, err := browse.ParseCursor(p.after)
		if err != nil {
			return usageErrorf("--after %q: %v", p.after, err)
		}
		if c.State != state {
			return usageErrorf("--after %q: a cursor of %s tasks, not %s", p.after, c.State, state)
		}
	}
	return nil
}

// listTask is a task as list prints it with --json: the fields of its
// state always, so that scripts need not guess what a missing one means.
type listTask struct {
	Shard int `json:"shard"`
	// DueMs is null, Due "never" and MessageID "" for a pending task that
	// is never due (scored +inf).
	DueMs     *int64 `json:"due_ms"`
	Due       string `json:"due"`
	MessageID string `json:"message_id"`
	// ID is the task id, "" (left out) for a member that is its own body.
	ID         string          `json:"id,omitempty"`
	Body       string          `json:"body"`
	Properties json.RawMessage `json:"properties,omitempty"`
	Score      string          `json:"score,omitempty"` // pending: as Redis holds it
	Misplaced  bool            `json:"beyond_shard_count,omitempty"`
	LeaseMs    *int64          `json:"lease_ms,omitempty"`
	Attempts   *int            `json:"attempts,omitempty"`
	Reason     *string         `json:"reason,omitempty"`
}

func newListCmd(s streams) *cobra.Command {
	var queue, state string
	var asJSON bool
	var pf pageFlags
	cmd := &cobra.Command{
		Use:   "list --queue Q [--state S] [--match GLOB] [--limit N] [--after C]",
		Short: "page through a queue's tasks in due order",
		Long: `list prints a queue's tasks a page at a time: pending and dead ones by due
time, in-flight ones by lease deadline (when any instance may hand them out
again), with their due time and failed publishes, and the id, body and
properties of each (a task scheduled without an id is its own body; --match
is on the member: the id, or that body). Each Redis call reads at
most 256 tasks of one shard, so listing a queue of millions does not hold
Redis. A page ends after --limit tasks, or after --max-scan tasks looked at
(a selective --match), with the cursor to give --after for the next page.
Pages are not a snapshot: the walk only goes forward, so a task scheduled
meanwhile shows if it falls after the cursor, and one rescheduled later
may show again.

Exit status: 0 listed, 1 Redis failed, 2 bad arguments or settings.`,
		Example: `  dispatcher list --queue orders --from now --to +1h
  dispatcher list --queue orders --match '*"customer":42,*' --limit 10
  dispatcher list --queue orders --state inflight --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := browse.ParseState(state)
			if err != nil {
				return usageErrorf("--state %q: want pending, inflight or dead", state)
			}
			if err := pf.checkLocal(st); err != nil {
				return err
			}
			se, q, ctx, done, err := openQueue(cmd, s, asJSON, queue, 5*time.Minute)
			if err != nil {
				return err
			}
			defer done()
			bq, err := pf.query(ctx, se, q, st, time.Now())
			if err != nil {
				return err
			}
			page, err := browse.Walk(ctx, se.rdb, bq)
			if err != nil {
				return se.redisFailure(err)
			}
			printList(se, q, st, page, se.adminQueue(q).Shards, beyondOf(bq.Shards, se.adminQueue(q).Shards))
			return nil
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.StringVar(&state, "state", string(browse.Pending), "which tasks `S`: pending, inflight or dead")
	pf.add(fs, true)
	jsonFlag(fs, &asJSON)
	return cmd
}

// printList prints a page of list; shards from span on (beyond, those
// holding tasks) are beyond the queue's shard count.
func printList(se *session, q config.Queue, st browse.State, page browse.Page, span int, beyond []int) {
	tasks := make([]listTask, len(page.Tasks))
	for n, t := range page.Tasks {
		lt := listTask{Shard: t.Shard, DueMs: &t.DueMs, Due: utcMs(t.DueMs, time.RFC3339Nano), MessageID: t.MessageID, ID: t.ID, Body: t.Body,
			Properties: t.Properties, Score: t.Score, Misplaced: t.Shard >= span}
		if t.Never {
			lt.DueMs, lt.Due = nil, "never"
		}
		switch st {
		case browse.Inflight:
			lt.LeaseMs, lt.Attempts = &t.LeaseMs, &t.Attempts
		case browse.Dead:
			lt.Reason = &t.Reason
		}
		tasks[n] = lt
	}
	se.print(map[string]any{"queue": q.Name, "state": st, "tasks": tasks, "scanned": page.Scanned, "next": nextCursor(page)},
		func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			head := "DUE (UTC)\tSHARD\tMESSAGE_ID\tID\tBODY\tPROPERTIES"
			switch st {
			case browse.Inflight:
				head += "\tLEASE (UTC)\tFAILED PUBLISHES"
			case browse.Dead:
				head += "\tREASON"
			}
			fmt.Fprintln(tw, head)
			for _, t := range page.Tasks {
				due, idx, id := utcMs(t.DueMs, humanTime), strconv.Itoa(t.Shard), t.MessageID
				if t.Never {
					due, id = "never (score "+t.Score+")", "-"
				}
				if t.Shard >= span {
					idx += "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s", due, idx, id, shortID(t.ID), shortBody(t.Body, bodyWidth), shortProps(t.Properties))
				switch st {
				case browse.Inflight:
					fmt.Fprintf(tw, "\t%s\t%d", utcMs(t.LeaseMs, humanTime), t.Attempts)
				case browse.Dead:
					fmt.Fprintf(tw, "\t%s", t.Reason)
				}
				fmt.Fprintln(tw)
			}
			tw.Flush()
			fmt.Fprintf(w, "%s (%d looked at)\n", plural(len(page.Tasks), string(st)+" task", string(st)+" tasks"), page.Scanned)
			if len(beyond) > 0 {
				which := "shards " + joinInts(beyond, 8) + " are"
				if len(beyond) == 1 {
					which = "shard " + strconv.Itoa(beyond[0]) + " is"
				}
				fmt.Fprintf(w, "* %s beyond the queue's %d: a producer hashes with a larger count than the recorded one; the sweeping instance moves their tasks to their shards within %s\n",
					which, span, scanner.StrayCycle)
			}
			printMore(w, page)
		})
}

// shortID is a task id for a table: quoted and cut, "-" for none.
func shortID(id string) string {
	if id == "" {
		return "-"
	}
	return shortBody(id, 40)
}

// shortProps is stored properties for a table: the JSON as stored, cut to
// bodyWidth characters; "-" for none.
func shortProps(p []byte) string {
	if len(p) == 0 {
		return "-"
	}
	s := strings.Join(strings.Fields(string(p)), " ")
	if r := []rune(s); len(r) > bodyWidth {
		return string(r[:bodyWidth]) + "… (" + plural(len(p), "byte", "bytes") + ")"
	}
	return s
}

const humanTime = "2006-01-02 15:04:05.000"

func utcMs(ms int64, layout string) string { return time.UnixMilli(ms).UTC().Format(layout) }

// beyondOf are the shards of a walk from span on.
func beyondOf(shards []int, span int) []int {
	var out []int
	for _, i := range shards {
		if i >= span {
			out = append(out, i)
		}
	}
	return out
}

// joinInts lists up to n numbers: "32, 40, 4095" or "32, 33, and 5 more".
func joinInts(xs []int, n int) string {
	parts := make([]string, 0, n+1)
	for k, x := range xs {
		if k == n {
			parts = append(parts, fmt.Sprintf("and %d more", len(xs)-n))
			break
		}
		parts = append(parts, strconv.Itoa(x))
	}
	return strings.Join(parts, ", ")
}

// nextCursor is page's cursor for --after, "" at the end.
func nextCursor(page browse.Page) string {
	if page.Next == nil {
		return ""
	}
	return page.Next.String()
}

// printMore tells how to go on, if there is more.
func printMore(w io.Writer, page browse.Page) {
	if page.Next != nil {
		fmt.Fprintf(w, "more: --after %s\n", page.Next)
	}
}
