package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/internal/bulk"
	"github.com/dispatcher/dispatcher/shard"
)

// bodyHelp says how a BODY argument is read, for schedule and cancel.
const bodyHelp = `BODY is the task's bytes; - reads them from stdin, dropping one trailing
newline (as echo adds) unless --raw. A body starting with - goes after --.`

func newScheduleCmd(s streams) *cobra.Command {
	var queue, in, at, id string
	var asJSON, raw, past bool
	var pf propFlags
	cmd := &cobra.Command{
		Use:   "schedule --queue Q [--id ID [PROPS]] (--in D | --at T) (BODY | -)",
		Short: "schedule a task, as a producer does",
		Long: `Schedules a task on queue Q, due in a duration (--in) or at a time
(--at), as a producer does: ZADD to its shard, and a wake-up.
` + bodyHelp + `
A due time in the past is refused unless --past (the task would go out at
once).

` + idHelp + `
The message then carries the header x-task-id (the id) and the
properties given: --header K=V (repeatable; V is a boolean if true or
false, an integer if it is one, else a string), --routing-key,
--priority, --content-type, --correlation-id, --expiration (the broker's
TTL) and --deadline (a task not published by then is dead-lettered
instead of going out late).

Needs DISPATCHER_REDIS_URL only (default redis://localhost:6379/0): the
queue's shard count is read from Redis, where the dispatcher records it.

Exit status: 0 scheduled, 1 Redis failed, 2 bad arguments or settings.`,
		Example: `  dispatcher schedule --queue default --in 10s 'hello'
  dispatcher schedule --queue default --at 2026-12-24T18:00:00Z 'hi'
  echo '{"order":42}' | dispatcher schedule --queue orders --in 1h -
  dispatcher schedule --queue orders --id order-42:timeout --in 30m \
      --header tenant=acme --header attempt=2 --deadline +45m '{"order":42}'`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			due, err := dueFlags(in, at, past, time.Now(), "schedule it due at once")
			if err != nil {
				return err
			}
			if len(args) != 1 {
				return usageErrorf("want one BODY, or - to read it from stdin; got %d arguments", len(args))
			}
			withID := cmd.Flags().Changed("id")
			if withID {
				if err := checkID(id); err != nil {
					return err
				}
			} else if f := pf.given(cmd); f != "" {
				return usageErrorf("--%s is a property of a task with an id: add --id", f)
			}
			props, err := pf.props(cmd, time.Now())
			if err != nil {
				return err
			}
			t, done, err := openTask(cmd, s, asJSON, queue, args[0], raw)
			if err != nil {
				return err
			}
			defer done()
			se, q, body := t.se, t.q, t.body
			if len(body) > se.cfg.MaxMessageBytes {
				return usageErrorf("the body is over DISPATCHER_MAX_MESSAGE_BYTES=%d bytes: it would go straight to the dead letters", se.cfg.MaxMessageBytes)
			}
			member := body
			if withID {
				member = []byte(id)
				err = t.p.ScheduleID(t.ctx, shard.IDTask{ID: member, Body: body, Props: props, Due: due})
			} else {
				err = t.p.Schedule(t.ctx, body, due)
			}
			if err != nil {
				return se.redisFailure(err)
			}
			res := map[string]any{"queue": q.Name, "shard": shard.Index(member, q.Shards), "due_ms": due.UnixMilli(),
				"message_id": shard.MessageID(member, due.UnixMilli())}
			if withID {
				res["id"] = id
			}
			se.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "scheduled on %s shard %d, due %s, message_id %s", q.Name, res["shard"],
					due.UTC().Format("2006-01-02 15:04:05.000Z"), res["message_id"])
				if withID {
					fmt.Fprintf(w, ", id %q", id)
				}
				fmt.Fprintln(w)
			})
			return nil
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.StringVar(&in, "in", "", "due in this `DURATION` (Go syntax: 90s, 10m, 2h)")
	fs.StringVar(&at, "at", "", "due at this `TIME`: "+timeHelp)
	fs.BoolVar(&past, "past", false, "accept a due time in the past: the task goes out at once")
	fs.BoolVar(&raw, "raw", false, "keep stdin's bytes as they are, trailing newline too")
	fs.StringVar(&id, "id", "", "the task's `ID` (1 to 1024 bytes): BODY is then its body")
	pf.add(fs)
	jsonFlag(fs, &asJSON)
	return cmd
}

func newCancelCmd(s streams) *cobra.Command {
	var queue, id string
	var asJSON, raw bool
	var bf bulkFlags
	cmd := &cobra.Command{
		Use:   "cancel --queue Q (--id ID | BODY | - | --match G | --all | ...)",
		Short: "cancel a pending task by its id or body, or many at once",
		Long: `Cancels the task with this body on queue Q while it is still pending
(ZREM from its shard). A task claimed already cannot be cancelled.
` + bodyHelp + `
With --id ID, cancels the task with that id, and removes its body and
properties.

` + bulkHelp + `
An unfiltered cancel needs --all.

Exit status: 0 cancelled (bulk: done, skipped tasks included), 1 not
pending, interrupted or Redis failed, 2 bad arguments or settings.`,
		Example: `  dispatcher cancel --queue default 'hello'
  dispatcher cancel --queue orders --id order-42:timeout
  dispatcher cancel --queue default --match 'order:42:*' --dry-run
  dispatcher cancel --queue default --match 'report:*' --from now --to +1h
  dispatcher cancel --queue default --resume 3fa94c0d12`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if bf.given(cmd) {
				if len(args) > 0 {
					return usageErrorf("a BODY (%q) and the bulk flags (--match, --from, --to, --all, --resume) do not go together", args[0])
				}
				if cmd.Flags().Changed("id") {
					return usageErrorf("--id and the bulk flags (--match, --from, --to, --all, --resume) do not go together")
				}
				spec, err := bf.spec(cmd, time.Now())
				if err != nil {
					return err
				}
				spec.Mode = bulk.Cancel
				return runBulk(cmd, s, queue, asJSON, &bf, spec, "cancel")
			}
			if cmd.Flags().Changed("id") {
				if len(args) > 0 {
					return usageErrorf("--id %q and a BODY (%q) do not go together: a task with an id is cancelled by its id", id, args[0])
				}
				t, done, err := openIDTask(cmd, s, asJSON, queue, id)
				if err != nil {
					return err
				}
				defer done()
				ok, err := t.p.CancelID(t.ctx, []byte(id))
				if err != nil {
					return t.se.redisFailure(err)
				}
				t.se.print(map[string]any{"queue": t.q.Name, "id": id, "cancelled": ok}, func(w io.Writer) {
					if ok {
						fmt.Fprintln(w, "cancelled")
					}
				})
				if !ok {
					return notPendingID(t.q, id)
				}
				return nil
			}
			if len(args) != 1 {
				return usageErrorf("want one BODY, or - to read it from stdin; got %d arguments", len(args))
			}
			t, done, err := openTask(cmd, s, asJSON, queue, args[0], raw)
			if err != nil {
				return err
			}
			defer done()
			se, q := t.se, t.q
			ok, err := t.p.Cancel(t.ctx, t.body)
			if err != nil {
				return se.redisFailure(err)
			}
			se.print(map[string]any{"queue": q.Name, "cancelled": ok}, func(w io.Writer) {
				if ok {
					fmt.Fprintln(w, "cancelled")
				}
			})
			if !ok {
				return failure(fmt.Errorf("not pending on %s (never scheduled, cancelled, or already claimed): nothing changed", q.Name))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.BoolVar(&raw, "raw", false, "keep stdin's bytes as they are, trailing newline too")
	fs.StringVar(&id, "id", "", "cancel the task with this `ID`")
	bf.add(fs)
	jsonFlag(fs, &asJSON)
	return cmd
}
