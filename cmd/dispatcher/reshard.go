package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

const reshardUsage = `usage:
  dispatcher reshard        --queue Q --shards N [--json]
  dispatcher reshard status --queue Q [--json]
  dispatcher reshard finish --queue Q [--json]

reshard changes queue Q's shard count to N while dispatchers and producers
keep running: it records N (producers that read it switch at once), moves the
pending tasks due later than 30 s and the dead letters to their shards by N,
and leaves the change in progress, both counts served. Run it again after an
interruption: it resumes. When every producer hashes with N (the metric
dispatcher_tasks_misplaced_total stops rising), finish waits for the shards N
no longer has to empty and ends the change. Only DISPATCHER_REDIS_URL and
DISPATCHER_KEY_PREFIX are read from the environment. See docs/resharding.md.
`

func runReshard(args []string, stdout, stderr io.Writer) int {
	verb := ""
	if len(args) > 0 && (args[0] == "status" || args[0] == "finish") {
		verb, args = args[0], args[1:]
	}
	c := &cli{name: "reshard", usage: reshardUsage, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("reshard", flag.ContinueOnError)
	queue := fs.String("queue", "", "")
	to := fs.Int("shards", 0, "")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	switch {
	case *queue == "":
		return c.usageErr("--queue is required")
	case !shard.ValidQueueName(*queue):
		return c.usageErr("--queue %q: want 1 to 64 characters of A-Z a-z 0-9 _ . -", *queue)
	case verb == "" && (*to < 1 || *to > shard.MaxShards):
		return c.usageErr("--shards %d: want a shard count 1..%d", *to, shard.MaxShards)
	case verb != "" && *to != 0:
		return c.usageErr("--shards is for starting a change, not for %s", verb)
	case fs.NArg() > 0:
		return c.usageErr("unexpected argument %q", fs.Arg(0))
	}
	if code, ok := c.connect(); !ok {
		return code
	}
	defer c.close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	keys := shard.Keys{Prefix: c.cfg.KeyPrefix, Queue: *queue}
	host, _ := os.Hostname()
	opt := reshard.Options{Name: fmt.Sprintf("%s/%d", host, os.Getpid()), Report: func(pass int, p reshard.Progress, waiting string) {
		if c.json {
			return
		}
		switch {
		case pass == 0:
			fmt.Fprintf(c.stdout, "%s\n", waiting)
		case waiting != "":
			fmt.Fprintf(c.stdout, "pass %d: moved %d; %s\n", pass, p.Moved+p.Kept+p.DeadMoved, waiting)
		default:
			fmt.Fprintf(c.stdout, "pass %d: scanned %d pending, moved %d (%d kept the new count's copy, %d raced by producers), %d dead letters; %d due within 30 s left where they are\n",
				pass, p.Scanned, p.Moved, p.Kept, p.Raced, p.DeadMoved, p.Near)
		}
	}}
	began := time.Now()
	switch verb {
	case "status":
		st, err := reshard.ReadStatus(ctx, c.rdb, keys)
		if err != nil {
			return c.fail(err)
		}
		c.print(st, func(w io.Writer) { writeReshardStatus(w, *queue, st) })
		return exitOK
	case "finish":
		l, p, err := reshard.Close(ctx, c.rdb, keys, opt)
		if err != nil {
			return c.fail(err)
		}
		c.print(map[string]any{"queue": *queue, "shards": l.Shards, "from": l.From, "progress": p}, func(w io.Writer) {
			fmt.Fprintf(w, "queue %s: finished the change from %d to %d shards in %s; dispatchers serve %d shards\n",
				*queue, l.From, l.Shards, time.Since(began).Round(time.Millisecond), l.Shards)
		})
		return exitOK
	}
	st, p, err := reshard.Reshard(ctx, c.rdb, keys, *to, opt)
	if err != nil {
		return c.fail(err)
	}
	c.print(map[string]any{"queue": *queue, "from": st.From, "shards": st.To, "resumed": st.Resumed, "unchanged": st.Same, "progress": p}, func(w io.Writer) {
		if st.Same {
			fmt.Fprintf(w, "queue %s already has %d shards; nothing to do\n", *queue, st.To)
			return
		}
		fmt.Fprintf(w, "queue %s: %d -> %d shards: moved %d pending tasks and %d dead letters in %s; %d due within 30 s are dispatched where they are.\n",
			*queue, st.From, st.To, p.Moved+p.Kept, p.DeadMoved, time.Since(began).Round(time.Millisecond), p.Near)
		fmt.Fprintf(w, "Both counts are served until `dispatcher reshard finish --queue %s`: run it once every producer hashes with %d\n(dispatcher_tasks_misplaced_total stops rising).\n", *queue, st.To)
	})
	return exitOK
}

func writeReshardStatus(w io.Writer, queue string, st reshard.Status) {
	if !st.Changing() {
		fmt.Fprintf(w, "queue %s: %s; no change in progress\n", queue, st.Layout)
		return
	}
	fmt.Fprintf(w, "queue %s: changing from %d to %d shards since %s (%s ago)\n", queue, st.From, st.Shards,
		st.Started.UTC().Format(time.RFC3339), time.Since(st.Started).Round(time.Second))
	if st.Passes == 0 {
		fmt.Fprintln(w, "no move has run yet")
		return
	}
	fmt.Fprintf(w, "moved %d pending tasks and %d dead letters in %d passes; the last, %s ago, left %d due soon where they are and %d in the shards being retired\n",
		st.Progress.Moved+st.Progress.Kept, st.Progress.DeadMoved, st.Passes, time.Since(st.PassAt).Round(time.Second), st.LastPass.Near, st.LastPass.Retiring)
}
