package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dispatcher/dispatcher/internal/bulk"
	"github.com/dispatcher/dispatcher/internal/glob"
	"github.com/dispatcher/dispatcher/shard"
)

// bulkHelp says how cancel and reschedule act on many tasks.
const bulkHelp = `With --match, --from, --to or --all instead of a BODY, it acts on every
pending task that matches: --match GLOB on the member, the task id (or
the body of a task scheduled without one) (Redis's MATCH syntax:
* ? [a-z] \x, on bytes; a range's ends must be ASCII), --from and --to on
the due time (inclusive; RFC 3339, Unix ms, now, or an offset such as -10m).
Each shard is walked in due-time order, a batch of --batch tasks per call,
and each task is changed only if it is still pending with the due time
read, as a single command would: one claimed, cancelled or rescheduled
meanwhile is left alone and reported as skipped. A cancelled task loses
its body and properties with it; a rescheduled one keeps them. --dry-run
counts and shows a sample, changing nothing. A run has an id, printed first on
stderr; its progress is kept in Redis for 7 days with each batch, and
--resume ID continues an interrupted run (Ctrl-C, a kill, a failure)
without doing anything twice. Refused while the queue's shard count
changes (dispatcher reshard): finish that first.`

// bulkFlags are the flags of the bulk forms of cancel and reschedule.
type bulkFlags struct {
	match, from, to, resume string
	all, dryRun             bool
	batch, stopAfter        int
}

func (b *bulkFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&b.match, "match", "", "act on the pending tasks whose member (task id, or body) matches `GLOB`")
	fs.StringVar(&b.from, "from", "", "... due at or after `TIME`")
	fs.StringVar(&b.to, "to", "", "... due at or before `TIME`")
	fs.BoolVar(&b.all, "all", false, "act on every pending task of the queue (no filter)")
	fs.BoolVar(&b.dryRun, "dry-run", false, "count the matching tasks and show a few, changing nothing")
	fs.StringVar(&b.resume, "resume", "", "continue the interrupted bulk run `ID`, as it started")
	fs.IntVar(&b.batch, "batch", bulk.DefaultBatch, fmt.Sprintf("tasks per Redis call: `N`, 1 to %d", bulk.MaxBatch))
	// A test hook: stop after so many batches, as an interruption would.
	fs.IntVar(&b.stopAfter, "stop-after", 0, "")
	_ = fs.MarkHidden("stop-after")
}

// given reports whether the command is in its bulk form.
func (b *bulkFlags) given(cmd *cobra.Command) bool {
	for _, f := range []string{"match", "from", "to", "all", "dry-run", "resume", "batch"} {
		if cmd.Flags().Changed(f) {
			return true
		}
	}
	return false
}

// spec checks the filter flags and returns the spec's filters, times
// read against now.
func (b *bulkFlags) spec(cmd *cobra.Command, now time.Time) (bulk.Spec, error) {
	var s bulk.Spec
	if b.batch < 1 || b.batch > bulk.MaxBatch {
		return s, usageErrorf("--batch %d: want 1..%d", b.batch, bulk.MaxBatch)
	}
	if b.resume != "" {
		if b.dryRun {
			return s, usageErrorf("--resume %s with --dry-run: a dry run has nothing to resume", b.resume)
		}
		if !bulk.ValidID(b.resume) {
			return s, usageErrorf("--resume %q: not a run id (10 hex digits, printed when the run started)", b.resume)
		}
		for _, f := range []string{"match", "from", "to", "all", "by", "at", "past"} {
			if cmd.Flags().Changed(f) {
				return s, usageErrorf("--resume %s continues the run as it started: drop --%s", b.resume, f)
			}
		}
		return s, nil
	}
	if cmd.Flags().Changed("match") && b.match == "" {
		return s, usageErrorf("--match: empty: give a glob, or --all for every task")
	}
	if b.match == "" && b.from == "" && b.to == "" && !b.all {
		return s, usageErrorf("give a filter (--match GLOB, --from TIME, --to TIME), or --all to act on every pending task of the queue")
	}
	if err := glob.Check(b.match); err != nil {
		return s, usageErrorf("--match: %v", err)
	}
	s.Match = b.match
	// An empty --from or --to is a mistake (an unset variable), not "no
	// bound": parseTime refuses it.
	if b.from != "" || cmd.Flags().Changed("from") {
		ms, err := parseTime("from", b.from, now)
		if err != nil {
			return s, err
		}
		s.FromMs = &ms
	}
	if b.to != "" || cmd.Flags().Changed("to") {
		ms, err := parseTime("to", b.to, now)
		if err != nil {
			return s, err
		}
		s.ToMs = &ms
	}
	if s.FromMs != nil && s.ToMs != nil && *s.FromMs > *s.ToMs {
		return s, usageErrorf("--from %q is after --to %q: no task is due in between", b.from, b.to)
	}
	return s, nil
}

// runBulk runs (or resumes) a bulk change of queue whose action spec
// holds (Mode, ByMs, AtMs; ignored on --resume), for command verb
// ("cancel" or "reschedule").
func runBulk(cmd *cobra.Command, s streams, queue string, asJSON bool, b *bulkFlags, spec bulk.Spec, verb string) error {
	se, q, setupCtx, done, err := openQueue(cmd, s, asJSON, queue, 10*time.Second)
	if err != nil {
		return err
	}
	defer done()
	keys := shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: q.Name}
	if l := se.layouts[q.Name]; l.Changing() {
		return failure(fmt.Errorf("queue %s: %s: tasks move between shards meanwhile; finish it first (dispatcher reshard finish --queue %s)", q.Name, l, q.Name))
	}
	id := b.resume
	if id != "" {
		if spec, err = bulk.Load(setupCtx, se.rdb, keys, id, bulk.DefaultTTL); errors.Is(err, bulk.ErrNoRun) {
			return usageErrorf("--resume %s: %v", id, err)
		} else if err != nil {
			return se.redisFailure(err)
		}
		if (spec.Mode == bulk.Cancel) != (verb == "cancel") {
			return usageErrorf("--resume %s: run %s is a %s run, not a %s", id, id, modeVerb(spec.Mode), verb)
		}
	} else {
		spec.Shards = q.Shards
		if err := spec.Validate(); err != nil {
			return usageErrorf("%v", err)
		}
		if !b.dryRun {
			id = bulk.NewID()
			if err := bulk.Record(setupCtx, se.rdb, keys, id, spec, bulk.DefaultTTL); err != nil {
				return se.redisFailure(err)
			}
		}
	}
	if id != "" {
		fmt.Fprintf(s.stderr, "bulk run %s; if interrupted, continue it with: dispatcher %s --queue %s --resume %s\n", id, verb, q.Name, id)
	}
	// The walk may take minutes: it ends with Ctrl-C or SIGTERM (between
	// batches, its progress recorded), not with the set-up's timeout.
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r := &bulk.Runner{RDB: se.rdb, Keys: keys, ID: id, Spec: spec, DryRun: b.dryRun, Batch: b.batch, StopAfter: b.stopAfter}
	var bar *progressBar
	if isTerminal(s.stderr) {
		bar = &progressBar{w: s.stderr}
		r.Progress = bar.update
	}
	res, runErr := r.Run(ctx)
	if bar != nil {
		bar.end()
	}
	interrupted := errors.Is(runErr, bulk.ErrStopped) || errors.Is(runErr, context.Canceled)
	if runErr != nil && !interrupted {
		switch {
		case errors.Is(runErr, bulk.ErrChanging), errors.Is(runErr, bulk.ErrBusy):
			return failure(fmt.Errorf("queue %s: %w", q.Name, runErr))
		}
		return se.redisFailure(fmt.Errorf("bulk run %s on queue %s: %w (continue it with --resume %s)", id, q.Name, runErr, id))
	}
	out := map[string]any{"queue": q.Name, "run": id, "dry_run": b.dryRun, "interrupted": interrupted,
		"matched": res.Matched, "changed": res.Changed, "skipped": res.Skipped,
		"skipped_sample": res.SkippedSample, "sample": res.Sample}
	se.print(out, func(w io.Writer) { printBulk(w, q.Name, spec, b.dryRun, res) })
	if interrupted {
		return failure(fmt.Errorf("interrupted: continue with dispatcher %s --queue %s --resume %s", verb, q.Name, id))
	}
	return nil
}

func modeVerb(m bulk.Mode) string {
	if m == bulk.Cancel {
		return "cancel"
	}
	return "reschedule"
}

// printBulk is a run's summary for people.
func printBulk(w io.Writer, queue string, spec bulk.Spec, dry bool, res bulk.Result) {
	done := map[bulk.Mode]string{bulk.Cancel: "cancelled", bulk.By: "rescheduled", bulk.At: "rescheduled"}[spec.Mode]
	if dry {
		verb := "match"
		if res.Matched == 1 {
			verb = "matches"
		}
		fmt.Fprintf(w, "%s on queue %s %s (dry run: nothing changed)\n", plural(int(res.Matched), "pending task", "pending tasks"), queue, verb)
		for _, t := range res.Sample {
			fmt.Fprintf(w, "  shard %-4d due %s  %s\n", t.Shard, time.UnixMilli(t.DueMs).UTC().Format("2006-01-02 15:04:05.000Z"), shortBody(t.Member, bodyWidth))
		}
		if int64(len(res.Sample)) < res.Matched {
			fmt.Fprintf(w, "  ...\n")
		}
		return
	}
	fmt.Fprintf(w, "%s %d of %d matching tasks on queue %s; %d skipped (claimed, cancelled or rescheduled meanwhile)\n",
		done, res.Changed, res.Matched, queue, res.Skipped)
	if len(res.SkippedSample) > 0 {
		fmt.Fprintf(w, "  skipped: %s\n", quoteAll(res.SkippedSample))
	}
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = shortBody(s, bodyWidth)
	}
	return strings.Join(q, ", ")
}

// isTerminal reports whether w is a terminal (a character device): only
// then is a progress bar drawn.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar draws a run's progress on one line of a terminal, at most
// ten times a second.
type progressBar struct {
	w    io.Writer
	last time.Time
	drew bool
}

func (b *progressBar) update(p bulk.Progress) {
	if time.Since(b.last) < 100*time.Millisecond {
		return
	}
	b.last = time.Now()
	const width = 30
	filled := width
	if p.Total > 0 && p.Walked < p.Total {
		filled = int(int64(width) * p.Walked / p.Total)
	}
	fmt.Fprintf(b.w, "\r[%s%s] shard %d/%d, %d of ~%d tasks walked, %d changed, %d skipped ",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.Shard+1, p.Shards, p.Walked, p.Total, p.Changed, p.Skipped)
	b.drew = true
}

func (b *progressBar) end() {
	if b.drew {
		fmt.Fprint(b.w, "\r\033[K")
	}
}
