package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/admin"
	"github.com/dispatcher/dispatcher/internal/browse"
	"github.com/dispatcher/dispatcher/shard"
)

func newDeadCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead (list | requeue | purge) --queue Q ...",
		Short: "list, requeue or purge dead letters",
		Long: `Dead letters are tasks the broker kept refusing, or over
DISPATCHER_MAX_MESSAGE_BYTES. A requeued dead letter keeps its due time, and
so its message_id, unless --now. A dead letter is named by its member: the
task id of a task scheduled with one, the body of one without. Requeued, a
task with an id gets its body and properties back; one whose member is
pending again (scheduled again since) is left dead, and the pending one
keeps its body and properties. Purged, it loses them with it.

Exit status: 0 done, 1 Redis failed or nothing to do (not dead), 2 bad
arguments or settings.`,
		// dead alone, or with a verb it does not know, is a mistake.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("want list, requeue or purge")
			}
			return usageErrorf("unknown command %q: want list, requeue or purge", args[0])
		},
		// Flags of the verbs given to dead itself (dead show --queue Q)
		// must not hide the unknown verb.
		FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
	}
	for _, verb := range []string{"list", "requeue", "purge"} {
		cmd.AddCommand(deadVerbCmd(s, verb))
	}
	return cmd
}

// deadVerbCmd is `dead list`, `dead requeue` or `dead purge`.
func deadVerbCmd(s streams, verb string) *cobra.Command {
	var queue string
	var asJSON, all, now, yes bool
	var pf pageFlags
	cmd := &cobra.Command{Args: cobra.ArbitraryArgs}
	switch verb {
	case "list":
		cmd.Use, cmd.Short = "list --queue Q [--match GLOB] [--limit N] [--after CURSOR]", "list the dead letters, by due time, a page at a time"
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("list takes no arguments: filter with --shard, --match, --from or --to")
			}
			return nil
		}
	case "requeue":
		cmd.Use, cmd.Short = "requeue --queue Q [--shard i] [--now] (--all | ID_OR_BODY...)", "schedule dead letters again"
	case "purge":
		cmd.Use, cmd.Short = "purge --queue Q [--shard i] --yes (--all | ID_OR_BODY...)", "forget dead letters for good"
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if verb == "list" {
			if err := pf.checkLocal(browse.Dead); err != nil {
				return err
			}
		}
		// --all goes through every dead letter in batches: its time is
		// that of the batches, each call bounded.
		timeout := 30 * time.Second
		if all {
			timeout = 24 * time.Hour
		}
		se, q, ctx, done, err := openQueue(cmd, s, asJSON, queue, timeout)
		if err != nil {
			return err
		}
		defer done()
		if span := se.adminQueue(q).Shards; pf.shardIdx < -1 || pf.shardIdx >= span {
			return usageErrorf("--shard %d: queue %s has shards 0 to %d", pf.shardIdx, q.Name, span-1)
		}
		if verb == "list" {
			bq, err := pf.query(ctx, se, q, browse.Dead, time.Now())
			if err != nil {
				return err
			}
			page, err := browse.Walk(ctx, se.rdb, bq)
			if err != nil {
				return se.redisFailure(err)
			}
			dead := make([]admin.Dead, len(page.Tasks))
			for n, t := range page.Tasks {
				dead[n] = admin.Dead{Shard: t.Shard, DueMs: t.DueMs, ID: t.ID, Body: t.Body, Properties: t.Properties,
					Member: t.Member, MessageID: t.MessageID, Reason: t.Reason, Entry: t.Entry}
			}
			se.print(map[string]any{"queue": q.Name, "dead": dead, "scanned": page.Scanned, "next": nextCursor(page)}, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "SHARD\tDUE (UTC)\tMESSAGE_ID\tID\tBODY\tPROPERTIES\tREASON")
				for _, d := range dead {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Shard, utcMs(d.DueMs, humanTime), d.MessageID, shortID(d.ID),
						shortBody(d.Body, bodyWidth), shortProps(d.Properties), d.Reason)
				}
				tw.Flush()
				fmt.Fprintln(w, plural(len(dead), "dead letter", "dead letters"))
				printMore(w, page)
			})
			return nil
		}
		if all == (len(args) > 0) {
			return usageErrorf("give --all or the ID (or BODY, for a task without an id) of each dead letter, not both")
		}
		if verb == "purge" && !yes {
			return usageErrorf("purge forgets tasks for good: add --yes (nothing changed)")
		}
		if all {
			return deadAll(ctx, s, se, q, verb, pf.shardIdx, now)
		}
		return deadChange(ctx, s, se, q, verb, args, pf.shardIdx, now)
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	if verb == "list" {
		pf.add(fs, true)
	} else {
		fs.IntVar(&pf.shardIdx, "shard", -1, "only shard `i` (default: every shard)")
	}
	jsonFlag(fs, &asJSON)
	if verb != "list" {
		fs.BoolVar(&all, "all", false, "every dead letter (of --shard), in batches of 256")
	}
	if verb == "requeue" {
		fs.BoolVar(&now, "now", false, "due now, with a new message_id")
	}
	if verb == "purge" {
		fs.BoolVar(&yes, "yes", false, "yes, forget them for good")
	}
	return cmd
}

// deadAll requeues or purges every dead letter (of shardIdx), a batch of
// up to 256 per call, printing each as it goes: it goes through millions
// without reading a whole set, and stops part-way having said what it did.
func deadAll(ctx context.Context, s streams, se *session, q config.Queue, verb string, shardIdx int, now bool) error {
	aq := se.adminQueue(q)
	at := int64(0)
	if now {
		at = time.Now().UnixMilli()
	}
	out := newDeadStream(se, q, verb)
	skipped := 0
	rg := browse.All
	if at != 0 {
		// A task requeued due now that died again is dead at that due time,
		// ahead of the walk: it is not this run's to requeue twice.
		rg.Max = browse.Bound{Score: float64(at), Open: true}
	}
	err := admin.DeadEach(ctx, se.rdb, aq, shardIdx, rg, func(batch []admin.Dead) error {
		if len(batch) == 0 {
			return nil
		}
		i := batch[0].Shard
		var res []admin.Outcome
		var err error
		if verb == "requeue" {
			res, err = admin.RequeueBatch(ctx, se.rdb, aq, i, batch, at)
		} else {
			res, err = admin.PurgeBatch(ctx, se.rdb, aq, i, batch)
		}
		if err != nil {
			return err
		}
		for n, r := range res {
			d := batch[n]
			switch r {
			case admin.Pending:
				fmt.Fprintf(s.stderr, "dispatcher dead requeue: %s (message_id %s): %v\n", shortBody(d.Member, bodyWidth), d.MessageID, admin.ErrPending)
				skipped++
			case admin.Done:
				if at != 0 {
					d.DueMs, d.MessageID = at, shard.MessageID([]byte(d.Member), at)
				}
				out.add(d)
			}
		}
		return nil
	})
	out.end()
	if err != nil {
		return se.redisFailure(err)
	}
	if skipped > 0 {
		return exitCode(exitFailure)
	}
	return nil
}

// deadChange requeues or purges the dead letters of args.
func deadChange(ctx context.Context, s streams, se *session, q config.Queue, verb string, args []string, shardIdx int, now bool) error {
	aq := se.adminQueue(q)
	var targets []admin.Dead
	var notDead []string
	for _, b := range args {
		d, err := admin.DeadOf(ctx, se.rdb, aq, []byte(b))
		if err != nil {
			return se.redisFailure(err)
		}
		if shardIdx >= 0 && shard.Index([]byte(b), q.Shards) != shardIdx {
			d = nil
		}
		if len(d) == 0 {
			notDead = append(notDead, b)
		}
		targets = append(targets, d...)
	}
	if len(notDead) > 0 {
		return failure(fmt.Errorf("not dead on %s: %s: nothing changed", q.Name, quoteAll(notDead)))
	}
	out := newDeadStream(se, q, verb)
	defer out.end()
	skipped := 0
	at := int64(0)
	if now {
		at = time.Now().UnixMilli()
	}
	for _, d := range targets {
		var ok bool
		var err error
		if verb == "requeue" {
			ok, err = admin.Requeue(ctx, se.rdb, aq, d, at)
			if errors.Is(err, admin.ErrPending) {
				fmt.Fprintf(s.stderr, "dispatcher dead requeue: %s (message_id %s): %v\n", shortBody(d.Member, bodyWidth), d.MessageID, err)
				skipped++
				continue
			}
			if ok && at != 0 {
				d.DueMs, d.MessageID = at, shard.MessageID([]byte(d.Member), at)
			}
		} else {
			ok, err = admin.Purge(ctx, se.rdb, aq, d)
		}
		if err != nil {
			return se.redisFailure(err)
		}
		if ok {
			out.add(d)
		}
	}
	if skipped > 0 {
		return exitCode(exitFailure)
	}
	return nil
}

// deadStream prints what a dead requeue or purge did as it goes (a line
// each, or the elements of one JSON object's array), also when it stops
// part-way: --all may go through millions, which are not held in memory.
type deadStream struct {
	se   *session
	past string
	n    int
}

func newDeadStream(se *session, q config.Queue, verb string) *deadStream {
	ds := &deadStream{se: se, past: map[string]string{"requeue": "requeued", "purge": "purged"}[verb]}
	if se.json {
		name, _ := json.Marshal(q.Name)
		fmt.Fprintf(se.stdout, "{\n  \"queue\": %s,\n  %q: [", name, ds.past)
	}
	return ds
}

func (ds *deadStream) add(d admin.Dead) {
	if ds.se.json {
		b, _ := json.Marshal(d)
		sep := ","
		if ds.n == 0 {
			sep = ""
		}
		fmt.Fprintf(ds.se.stdout, "%s\n    %s", sep, b)
	} else {
		what := shortBody(d.Member, bodyWidth)
		if d.ID != "" {
			what = "id " + what
		}
		fmt.Fprintf(ds.se.stdout, "%s shard %d %s message_id %s\n", ds.past, d.Shard, what, d.MessageID)
	}
	ds.n++
}

func (ds *deadStream) end() {
	switch {
	case !ds.se.json:
		fmt.Fprintf(ds.se.stdout, "%d %s\n", ds.n, ds.past)
	case ds.n == 0:
		fmt.Fprint(ds.se.stdout, "]\n}\n")
	default:
		fmt.Fprint(ds.se.stdout, "\n  ]\n}\n")
	}
}
