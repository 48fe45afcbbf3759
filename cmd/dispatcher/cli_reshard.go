package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

func newReshardCmd(s streams) *cobra.Command {
	var queue string
	var to int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "reshard --queue Q --shards N",
		Short: "change a queue's shard count while everything keeps running",
		Long: `Changes queue Q's shard count to N while dispatchers and producers keep
running: it records N (producers that read it switch within a second), every
dispatcher serves the shards of both counts, and it moves the pending tasks
due later than 30 s and the dead letters to their shards by N. The change
stays in progress until 'dispatcher reshard finish'. Run it again after an
interruption: it resumes.

Needs DISPATCHER_REDIS_URL (and DISPATCHER_KEY_PREFIX) only. See
docs/resharding.md.

Exit status: 0 done, 1 Redis failed, 2 bad arguments, or another change is
in progress.`,
		Example: `  dispatcher reshard --queue orders --shards 64
  dispatcher reshard status --queue orders
  dispatcher reshard finish --queue orders`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if to < 1 || to > shard.MaxShards {
				return usageErrorf("--shards %d: want a shard count 1 to %d", to, shard.MaxShards)
			}
			return withReshard(cmd, s, queue, asJSON, func(ctx context.Context, se *session, keys shard.Keys, opt reshard.Options) error {
				began := time.Now()
				st, p, err := reshard.Reshard(ctx, se.rdb, keys, to, opt)
				if err != nil {
					if errorsIsBusy(err) {
						return settingsError(err)
					}
					return se.redisFailure(err)
				}
				se.print(map[string]any{"queue": queue, "from": st.From, "shards": st.To, "resumed": st.Resumed, "unchanged": st.Same, "progress": p}, func(w io.Writer) {
					if st.Same {
						fmt.Fprintf(w, "queue %s already has %d shards; nothing to do\n", queue, st.To)
						return
					}
					fmt.Fprintf(w, "queue %s: %d -> %d shards: moved %d pending tasks and %d dead letters in %s; %d due within 30 s are dispatched where they are.\n",
						queue, st.From, st.To, p.Moved+p.Kept, p.DeadMoved, time.Since(began).Round(time.Millisecond), p.Near)
					fmt.Fprintf(w, "Both counts are served until `dispatcher reshard finish --queue %s`: run it once every\nproducer hashes with %d (dispatcher_tasks_misplaced_total stops rising).\n", queue, st.To)
				})
				return nil
			})
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.IntVar(&to, "shards", 0, "the new shard count `N` (1 to 4096)")
	jsonFlag(fs, &asJSON)
	cmd.AddCommand(newReshardStatusCmd(s), newReshardFinishCmd(s))
	return cmd
}

func newReshardStatusCmd(s streams) *cobra.Command {
	var queue string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status --queue Q",
		Short: "the change of a queue's shard count in progress",
		Long: `Shows queue Q's layout and, during a change of its shard count, the old and
new count, since when, and what the move has done and left.

Exit status: 0 shown, 1 Redis failed, 2 bad arguments.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withReshard(cmd, s, queue, asJSON, func(ctx context.Context, se *session, keys shard.Keys, _ reshard.Options) error {
				st, err := reshard.ReadStatus(ctx, se.rdb, keys)
				if err != nil {
					return se.redisFailure(err)
				}
				se.print(st, func(w io.Writer) { writeReshardStatus(w, queue, st) })
				return nil
			})
		},
	}
	queueFlag(cmd.Flags(), &queue)
	jsonFlag(cmd.Flags(), &asJSON)
	return cmd
}

func newReshardFinishCmd(s streams) *cobra.Command {
	var queue string
	var asJSON bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "finish --queue Q",
		Short: "end a change of a queue's shard count",
		Long: `Ends the change of queue Q's shard count in progress: it moves what
producers on the old count wrote since, waits for the shards the new count
no longer has (after a shrink) to empty, then has the dispatchers serve the
new count's shards only. After a shrink, what a producer still on the old
count writes to the retired shards is moved by the dispatchers.

Exit status: 0 finished, 1 Redis failed or the retired shards did not
empty within --wait, 2 bad arguments.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withReshard(cmd, s, queue, asJSON, func(ctx context.Context, se *session, keys shard.Keys, opt reshard.Options) error {
				began := time.Now()
				opt.Wait = wait
				l, p, err := reshard.Close(ctx, se.rdb, keys, opt)
				if err != nil {
					return se.redisFailure(err)
				}
				se.print(map[string]any{"queue": queue, "shards": l.Shards, "from": l.From, "progress": p}, func(w io.Writer) {
					fmt.Fprintf(w, "queue %s: finished the change from %d to %d shards in %s; dispatchers serve %d shards\n",
						queue, l.From, l.Shards, time.Since(began).Round(time.Millisecond), l.Shards)
				})
				return nil
			})
		},
	}
	queueFlag(cmd.Flags(), &queue)
	jsonFlag(cmd.Flags(), &asJSON)
	cmd.Flags().DurationVar(&wait, "wait", 0, "how long, a `DURATION`, to wait for the retired shards to empty (default 2m30s)")
	return cmd
}

// withReshard opens Redis for a reshard command on queue and runs do with
// the queue's keys and mover options (progress on stdout unless --json),
// until SIGINT or SIGTERM.
func withReshard(cmd *cobra.Command, s streams, queue string, asJSON bool,
	do func(ctx context.Context, se *session, keys shard.Keys, opt reshard.Options) error) error {
	if queue == "" {
		return usageErrorf("--queue is required")
	}
	if !shard.ValidQueueName(queue) {
		return usageErrorf("--queue %q: want 1 to 64 characters of A-Z a-z 0-9 _ . -", queue)
	}
	se, err := openSession(s, asJSON)
	if err != nil {
		return err
	}
	defer se.close()
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	host, _ := os.Hostname()
	opt := reshard.Options{Name: fmt.Sprintf("%s/%d", host, os.Getpid()), Report: func(pass int, p reshard.Progress, waiting string) {
		if asJSON {
			return
		}
		switch {
		case pass == 0:
			fmt.Fprintln(s.stdout, waiting)
		case waiting != "":
			fmt.Fprintf(s.stdout, "pass %d: moved %d; %s\n", pass, p.Moved+p.Kept+p.DeadMoved, waiting)
		default:
			fmt.Fprintf(s.stdout, "pass %d: scanned %d pending, moved %d (%d kept the new count's copy, %d raced by producers), %d dead letters; %d due within 30 s left where they are\n",
				pass, p.Scanned, p.Moved, p.Kept, p.Raced, p.DeadMoved, p.Near)
		}
	}}
	return do(ctx, se, shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: queue}, opt)
}

func errorsIsBusy(err error) bool { return errors.Is(err, reshard.ErrBusy) }

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
