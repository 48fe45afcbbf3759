package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/admin"
	"github.com/dispatcher/dispatcher/shard"
)

func newDeadCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead (list | requeue | purge) --queue Q ...",
		Short: "list, requeue or purge dead letters",
		Long: `Dead letters are tasks the broker kept refusing, or over
DISPATCHER_MAX_MESSAGE_BYTES. A requeued dead letter keeps its due time, and
so its message_id, unless --now.

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
	var shardIdx int
	var asJSON, all, now, yes bool
	cmd := &cobra.Command{Args: cobra.ArbitraryArgs}
	switch verb {
	case "list":
		cmd.Use, cmd.Short = "list --queue Q [--shard i]", "list the dead letters"
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("list takes only --queue, --shard and --json")
			}
			return nil
		}
	case "requeue":
		cmd.Use, cmd.Short = "requeue --queue Q [--shard i] [--now] (--all | BODY...)", "schedule dead letters again"
	case "purge":
		cmd.Use, cmd.Short = "purge --queue Q [--shard i] --yes (--all | BODY...)", "forget dead letters for good"
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		se, q, ctx, done, err := openQueue(cmd, s, asJSON, queue, 30*time.Second)
		if err != nil {
			return err
		}
		defer done()
		if span := se.adminQueue(q).Shards; shardIdx < -1 || shardIdx >= span {
			return usageErrorf("--shard %d: queue %s has shards 0 to %d", shardIdx, q.Name, span-1)
		}
		aq := se.adminQueue(q)
		if verb == "list" {
			dead, err := admin.DeadList(ctx, se.rdb, aq, shardIdx)
			if err != nil {
				return se.redisFailure(err)
			}
			se.print(map[string]any{"queue": q.Name, "dead": nonNil(dead)}, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "SHARD\tDUE (UTC)\tMESSAGE_ID\tBODY\tREASON")
				for _, d := range dead {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%q\t%s\n", d.Shard, time.UnixMilli(d.DueMs).UTC().Format("2006-01-02 15:04:05.000"), d.MessageID, d.Member, d.Reason)
				}
				tw.Flush()
				fmt.Fprintf(w, "%d dead letters\n", len(dead))
			})
			return nil
		}
		if all == (len(args) > 0) {
			return usageErrorf("give --all or the BODY of each dead letter, not both")
		}
		if verb == "purge" && !yes {
			return usageErrorf("purge forgets tasks for good: add --yes (nothing changed)")
		}
		return deadChange(ctx, s, se, q, verb, args, shardIdx, all, now)
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.IntVar(&shardIdx, "shard", -1, "only shard `i` (default: every shard)")
	jsonFlag(fs, &asJSON)
	if verb != "list" {
		fs.BoolVar(&all, "all", false, "every dead letter (of --shard)")
	}
	if verb == "requeue" {
		fs.BoolVar(&now, "now", false, "due now, with a new message_id")
	}
	if verb == "purge" {
		fs.BoolVar(&yes, "yes", false, "yes, forget them for good")
	}
	return cmd
}

// deadChange requeues or purges the dead letters of args (or all).
func deadChange(ctx context.Context, s streams, se *session, q config.Queue, verb string, args []string, shardIdx int, all, now bool) error {
	aq := se.adminQueue(q)
	var targets []admin.Dead
	var notDead []string
	if all {
		d, err := admin.DeadList(ctx, se.rdb, aq, shardIdx)
		if err != nil {
			return se.redisFailure(err)
		}
		targets = d
	} else {
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
	}
	if len(notDead) > 0 {
		return failure(fmt.Errorf("not dead on %s: %q: nothing changed", q.Name, notDead))
	}
	var done []admin.Dead
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
				fmt.Fprintf(s.stderr, "dispatcher dead requeue: %q (message_id %s): %v\n", d.Member, d.MessageID, err)
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
			deadReport(se, q, verb, done)
			return se.redisFailure(err)
		}
		if ok {
			done = append(done, d)
		}
	}
	deadReport(se, q, verb, done)
	if skipped > 0 {
		return exitCode(exitFailure)
	}
	return nil
}

// deadReport prints what a dead requeue or purge did, also when it
// stopped part-way.
func deadReport(se *session, q config.Queue, verb string, done []admin.Dead) {
	past := map[string]string{"requeue": "requeued", "purge": "purged"}[verb]
	se.print(map[string]any{"queue": q.Name, past: nonNil(done)}, func(w io.Writer) {
		for _, d := range done {
			fmt.Fprintf(w, "%s shard %d %q message_id %s\n", past, d.Shard, d.Member, d.MessageID)
		}
		fmt.Fprintf(w, "%d %s\n", len(done), past)
	})
}

func nonNil(d []admin.Dead) []admin.Dead {
	if d == nil {
		return []admin.Dead{}
	}
	return d
}
