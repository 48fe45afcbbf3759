package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/internal/forecast"
	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

func newStatsCmd(s streams) *cobra.Command {
	var queues []string
	var asJSON, ahead, summary, perShard bool
	var window, step time.Duration
	cmd := &cobra.Command{
		Use:   "stats [--queue Q]... [--summary | --shards | --forecast] [--json]",
		Short: "what the queues hold, per shard, read from Redis",
		Long: `Reads what the queues hold from Redis: per queue and shard, the tasks
pending, due, in flight (and those whose lease ran out), dead-lettered, how
late the oldest due task is (pending or retried), how many tasks are
retried after failed publishes and how late the oldest of them is, when the
next one is due, and which instance sweeps the queue. A shard that cannot
be read is shown as broken with its error.

The table has a row per queue and, with --shards, a row per shard under
it; without either flag, the shards' rows are shown when the queues have
8 shards or fewer in all (--summary leaves them out). --json always has
every shard.

With --forecast, how many pending tasks fall due in each --step of the next
--window (by the Redis clock, from its current second), how many are
overdue, and the busiest second ahead: a second holding more tasks than the
queue drains in 10 s (the lower of DISPATCHER_QUEUE_<NAME>_MAX_RATE and
_DRAIN_RATE, default 1000/s) is a thundering herd. Counts only (ZCOUNT per
bucket and shard), never a scan: as cheap on 10^7 tasks as on 10.

The queues are those given with --queue, else DISPATCHER_QUEUES, else every
queue whose shard count is recorded in Redis. Each queue's shard count is
the one recorded in Redis (during a change of it, the shards of both
counts); a DISPATCHER_QUEUE_<NAME>_SHARDS that differs gets a warning.

A queue with an AMQP ingress (DISPATCHER_QUEUE_<NAME>_INGRESS_EXCHANGE) has
a row in a second table, from the records its live instances write every
5 s: the messages ready in its ingress queue, the age of the oldest
message not yet in Redis, the tasks written per second and the errors
over the last minute, and how many instances consume it.

Exit status: 0 read (broken shards are shown, not an error), 1 no shard
could be read, 2 bad arguments or settings.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			se, ctx, names, done, err := openQueues(cmd, s, asJSON, queues, 10*time.Second)
			if err != nil {
				return err
			}
			defer done()
			if len(names) == 0 {
				return settingsError(fmt.Errorf("no queue has its shard count recorded under %s:{*}:shards, and DISPATCHER_QUEUES is not set: give --queue", se.cfg.KeyPrefix))
			}
			if !ahead && (cmd.Flags().Changed("window") || cmd.Flags().Changed("step")) {
				return usageErrorf("--window and --step go with --forecast")
			}
			if summary && perShard {
				return usageErrorf("--summary and --shards: give one or the other")
			}
			if ahead && (summary || perShard) {
				return usageErrorf("--summary and --shards go without --forecast")
			}
			if ahead {
				w := forecast.Window{Span: window, Step: step}
				if err := w.Check(); err != nil {
					return usageErrorf("--window %s --step %s: %v", window, step, err)
				}
				fs, err := se.readForecasts(ctx, names, w)
				if err != nil {
					return err
				}
				se.print(map[string]any{"forecasts": fs}, func(w io.Writer) { writeForecasts(w, fs) })
				return nil
			}
			var targets []queuestate.Target
			for _, name := range names {
				q, err := se.queue(ctx, name, false)
				if err != nil {
					return err
				}
				span := se.layouts[q.Name].Span()
				// Shards beyond the count that hold tasks: a producer
				// hashing with a larger count wrote them.
				beyond, err := shard.Beyond(ctx, se.rdb, shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: q.Name}.Pending, span)
				if err != nil {
					return se.redisFailure(err)
				}
				targets = append(targets, queuestate.Target{Name: q.Name, Shards: span, Beyond: beyond})
			}
			states, err := queuestate.Read(ctx, se.rdb, se.cfg.KeyPrefix, targets)
			if err != nil {
				return se.redisFailure(err)
			}
			for n := range states {
				l := se.layouts[states[n].Name]
				states[n].Layout = &l
			}
			rows := 0
			for _, q := range states {
				rows += len(q.Shards)
			}
			shown := perShard || !summary && rows <= summaryAbove
			out := map[string]any{"queues": states}
			ingresses, skipped := readIngressStats(ctx, se, names)
			if len(ingresses) > 0 {
				out["ingress"] = ingresses
			}
			se.print(out, func(w io.Writer) {
				writeStats(w, se.cfg.KeyPrefix, states, shown)
				if !shown && !summary {
					fmt.Fprintf(w, "(%d shards in all: a row per queue; --shards shows every shard)\n", rows)
				}
				writeIngressStats(w, ingresses, skipped)
			})
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&queues, "queue", "q", nil, "only queue `Q`; may be repeated")
	cmd.Flags().BoolVar(&ahead, "forecast", false, "show the tasks falling due per --step over the next --window, and the busiest second")
	cmd.Flags().BoolVar(&summary, "summary", false, "a row per queue, without its shards")
	cmd.Flags().BoolVar(&perShard, "shards", false, "a row per shard too, however many")
	cmd.Flags().DurationVar(&window, "window", time.Hour, "with --forecast: how far ahead to look, a `DURATION` that is a multiple of --step")
	cmd.Flags().DurationVar(&step, "step", time.Minute, "with --forecast: the width of a bucket, a `DURATION` of whole seconds")
	jsonFlag(cmd.Flags(), &asJSON)
	return cmd
}

// recordedQueues are the queues whose shard count is recorded under
// prefix, sorted; on a cluster, every primary is scanned.
func recordedQueues(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]string, error) {
	head, tail := prefix+":{", "}:shards"
	var mu sync.Mutex // a cluster's primaries are scanned at once
	var out []string
	err := redisconn.ForEachPrimary(ctx, rdb, func(ctx context.Context, _ string, c *redis.Client) error {
		it := c.Scan(ctx, 0, redisconn.GlobEscape(head)+"*"+tail, 1000).Iterator()
		for it.Next(ctx) {
			q := strings.TrimSuffix(strings.TrimPrefix(it.Val(), head), tail)
			mu.Lock()
			if !slices.Contains(out, q) {
				out = append(out, q)
			}
			mu.Unlock()
		}
		return it.Err()
	})
	slices.Sort(out)
	return out, err
}

// summaryAbove is how many shard rows, all queues together, the table
// shows by default; more and it has a row per queue only.
const summaryAbove = 8

// writeStats prints the human table: per queue a line of sums, then, with
// perShard, a line per shard; after it, who sweeps each queue and why
// broken shards are. Without perShard the second column is the queue's
// shard count, and the broken shards are named in the notes.
func writeStats(w io.Writer, prefix string, states []queuestate.Queue, perShard bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	second := "SHARD"
	if !perShard {
		second = "SHARDS"
	}
	fmt.Fprintln(tw, "QUEUE\t"+second+"\tPENDING\tDUE\tIN FLIGHT\tLEASE RAN OUT\tDEAD\tOLDEST DUE AGE\tRETRIED\tOLDEST RETRIED AGE\tNEXT DUE (UTC)\t")
	var notes []string
	for _, q := range states {
		first := "all"
		if !perShard {
			first = fmt.Sprint(len(q.Shards))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t\n", q.Name, first, q.Pending, q.Due, q.Inflight, q.Expired, q.Dead, age(q.OldestDueAge), q.Retried, age(q.RetriedAge), nextDue(q.NextDueMs))
		if !perShard {
			notes = append(notes, brokenNotes(q)...)
		}
		k := shard.Keys{Prefix: prefix, Queue: q.Name}
		var beyond []string
		for _, s := range q.Shards {
			idx := strconv.Itoa(s.Index)
			if s.Beyond {
				idx += "*"
				beyond = append(beyond, k.Pending(s.Index))
			}
			if s.Err == "" {
				notes = append(notes, scoreNotes(q.Name, k.Pending(s.Index), s)...)
			}
			if !perShard {
				continue
			}
			if s.Err != "" {
				fmt.Fprintf(tw, "%s\t%s\tBROKEN\t\t\t\t\t\t\t\t\t\n", q.Name, idx)
				notes = append(notes, fmt.Sprintf("queue %s shard %d is broken: %s", q.Name, s.Index, s.Err))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t\n", q.Name, idx, s.Pending, s.Due, s.Inflight, s.Expired, s.Dead, age(s.OldestDueAge), s.Retried, age(s.RetriedAge), nextDue(s.NextDueMs))
		}
		if len(beyond) > 0 {
			notes = append(notes, fmt.Sprintf("queue %s has %d pending tasks in shards beyond its %d (*: %s): a producer hashes with a larger count than the recorded one; the sweeping instance moves them to their shards within %s, and counts them in dispatcher_tasks_misplaced_total",
				q.Name, q.Beyond, len(q.Shards)-len(beyond), strings.Join(beyond, ", "), scanner.StrayCycle))
		}
		if l := q.Layout; l != nil && l.Changing() {
			notes = append(notes, fmt.Sprintf("queue %s is changing its shard count from %d to %d (shards 0..%d served): `dispatcher reshard status --queue %s`",
				q.Name, l.From, l.Shards, l.Span()-1, q.Name))
		}
		sweeper := q.Sweeper
		switch {
		case q.SweeperErr != "":
			sweeper = "an instance not known (cannot read the role: " + q.SweeperErr + ")"
		case sweeper == "":
			sweeper = "no instance (none running, or the role is changing hands)"
		}
		notes = append(notes, fmt.Sprintf("queue %s is swept by %s", q.Name, sweeper))
		if q.Retried > 0 {
			notes = append(notes, fmt.Sprintf("queue %s has %s retried after failed publishes (the oldest %s late): the instances' logs and /readyz name the cause",
				q.Name, plural(int(q.Retried), "task", "tasks"), age(q.RetriedAge)))
		}
		if q.Paused > 0 {
			notes = append(notes, fmt.Sprintf("queue %s is PAUSED (%d of %d shards): nothing is claimed until `dispatcher resume --queue %s`", q.Name, q.Paused, len(q.Shards), q.Name))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}

// scoreNotes tell of a shard's tasks with bad scores (shard/score.go).
func scoreNotes(queue, key string, s queuestate.Shard) []string {
	var out []string
	if u := s.FirstUndated; u != nil {
		out = append(out, fmt.Sprintf("queue %s shard %d (%s) has %d tasks scored 0 or less, -inf, or in seconds before 1973 (the first: %q, score %s): no real due time; dispatched at once, their lateness is not known (left out of OLDEST DUE AGE)",
			queue, s.Index, key, s.Undated, u.Member, u.Score))
	}
	if f := s.LastFar; f != nil {
		out = append(out, fmt.Sprintf("queue %s shard %d (%s) has %d tasks scored after year 5138 (the last: %q, score %s): micro- or nanoseconds written for ms, or +inf; they wait until then (+inf forever)",
			queue, s.Index, key, s.Far, f.Member, f.Score))
	}
	return out
}

// brokenNotes name a queue's broken shards by error, a line each, eight
// shards at most: "queue orders shards 3, 5 are broken: WRONGTYPE ...".
func brokenNotes(q queuestate.Queue) []string {
	errs, by := q.BrokenShards()
	var out []string
	for _, e := range errs {
		idx := by[e]
		list := queuestate.JoinIndexes(idx, 8)
		if len(idx) == 1 {
			out = append(out, fmt.Sprintf("queue %s shard %s is broken: %s", q.Name, list, e))
		} else {
			out = append(out, fmt.Sprintf("queue %s shards %s are broken: %s", q.Name, list, e))
		}
	}
	return out
}

func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

func nextDue(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05.000")
}
