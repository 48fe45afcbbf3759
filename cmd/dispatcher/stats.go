package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/redact"
)

const statsUsage = `usage: dispatcher stats [--queue Q] [--json]

Reads what the queues hold from Redis, with the daemon's settings from the
environment (DISPATCHER_REDIS_URL, DISPATCHER_KEY_PREFIX, DISPATCHER_QUEUES,
DISPATCHER_QUEUE_<NAME>_SHARDS, ...): per queue and shard, the tasks pending,
due, in flight (and those whose lease ran out), dead-lettered, how late the
oldest due task is (pending or retried), how many tasks are retried after
failed publishes and how late the oldest of them is, when the next one is
due, and which instance sweeps the queue. A shard that cannot be read is
shown as broken with its error.

  --queue Q   only queue Q (one of DISPATCHER_QUEUES); may be repeated
  --json      one JSON document, for scripts

Exit status: 0 read (broken shards are shown, not an error), 1 no shard
could be read, 2 bad arguments or settings.
`

// queueList is a repeatable --queue flag.
type queueList []string

func (q *queueList) String() string     { return strings.Join(*q, ",") }
func (q *queueList) Set(v string) error { *q = append(*q, v); return nil }

// runStats is `dispatcher stats`.
func runStats(args []string, stdout, stderr io.Writer) int {
	c := &cli{name: "stats", usage: statsUsage, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	var queues queueList
	fs.Var(&queues, "queue", "")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return c.usageErr("unexpected argument %q", fs.Arg(0))
	}
	if code, ok := c.connect(); !ok {
		return code
	}
	defer c.close()
	for _, q := range queues {
		if code, ok := c.knownQueue(q); !ok {
			return code
		}
	}
	var targets []queuestate.Target
	for _, q := range c.cfg.QueueSettings {
		if len(queues) == 0 || slices.Contains(queues, q.Name) {
			targets = append(targets, queuestate.Target{Name: q.Name, Shards: q.Shards})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	states, err := queuestate.Read(ctx, c.rdb, c.cfg.KeyPrefix, targets)
	if err != nil {
		return c.fail(fmt.Errorf("%s: %w", redact.URL(c.cfg.RedisURL), err))
	}
	c.print(map[string]any{"queues": states}, func(w io.Writer) { writeStats(w, states) })
	return exitOK
}

// writeStats prints the human table: per queue a line of sums, then a line
// per shard; after it, who sweeps each queue and why broken shards are.
func writeStats(w io.Writer, states []queuestate.Queue) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "QUEUE\tSHARD\tPENDING\tDUE\tIN FLIGHT\tLEASE RAN OUT\tDEAD\tOLDEST DUE AGE\tRETRIED\tOLDEST RETRIED AGE\tNEXT DUE (UTC)\t")
	var notes []string
	for _, q := range states {
		fmt.Fprintf(tw, "%s\tall\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t\n", q.Name, q.Pending, q.Due, q.Inflight, q.Expired, q.Dead, age(q.OldestDueAge), q.Retried, age(q.RetriedAge), nextDue(q.NextDueMs))
		for _, s := range q.Shards {
			if s.Err != "" {
				fmt.Fprintf(tw, "%s\t%d\tBROKEN\t\t\t\t\t\t\t\t\t\n", q.Name, s.Index)
				notes = append(notes, fmt.Sprintf("queue %s shard %d is broken: %s", q.Name, s.Index, s.Err))
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t\n", q.Name, s.Index, s.Pending, s.Due, s.Inflight, s.Expired, s.Dead, age(s.OldestDueAge), s.Retried, age(s.RetriedAge), nextDue(s.NextDueMs))
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
			notes = append(notes, fmt.Sprintf("queue %s has %d tasks retried after failed publishes (the oldest %s late): the instances' logs and /readyz name the cause",
				q.Name, q.Retried, age(q.RetriedAge)))
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
