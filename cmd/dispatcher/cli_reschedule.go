package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/internal/bulk"
	"github.com/dispatcher/dispatcher/shard"
)

func newRescheduleCmd(s streams) *cobra.Command {
	var queue, in, at, by, id string
	var asJSON, raw, past bool
	var bf bulkFlags
	cmd := &cobra.Command{
		Use:   "reschedule --queue Q (--in|--at|--by) V (--id ID|BODY|--match G)",
		Short: "move a pending task to a new due time, or many at once",
		Long: `Moves the task with this body on queue Q, while it is still pending, to a
new due time: in a duration (--in) or at a time (--at: RFC 3339, Unix ms,
now, or an offset such as +2h). A task claimed already cannot be moved.
` + bodyHelp + `
With --id ID, moves the task with that id; its body and properties stay
as they are. Moving it to the due time it has already is no change, and
says so.
A due time in the past is refused unless --past (the task goes out at
once).

` + bulkHelp + `
In bulk, --by D shifts each task's due time by D (negative:
earlier), and --at T sets it; tasks already due at T are left as they are.
A task moved to be due within a second wakes the dispatchers.

Exit status: 0 moved (bulk: done, skipped tasks included), 1 not pending,
interrupted or Redis failed, 2 bad arguments or settings.`,
		Example: `  dispatcher reschedule --queue default --in 1h 'hello'
  dispatcher reschedule --queue orders --id order-42:timeout --at +2h
  dispatcher reschedule --queue default --match 'order:*' --by 30m --dry-run
  dispatcher reschedule --queue default --from now --to +1h --by -1h
  dispatcher reschedule --queue default --match 'digest:*' --at +24h
  dispatcher reschedule --queue default --resume 3fa94c0d12`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			now := time.Now()
			if bf.given(cmd) {
				if len(args) > 0 {
					return usageErrorf("a BODY (%q) and the bulk flags (--match, --from, --to, --all, --resume) do not go together", args[0])
				}
				if in != "" {
					return usageErrorf("--in %q is for one task: in bulk, --by D shifts each task's due time, --at T sets it", in)
				}
				if cmd.Flags().Changed("id") {
					return usageErrorf("--id and the bulk flags (--match, --from, --to, --all, --resume) do not go together")
				}
				spec, err := bf.spec(cmd, now)
				if err != nil {
					return err
				}
				if bf.resume == "" {
					if spec, err = bulkMove(spec, by, at, past, now); err != nil {
						return err
					}
				}
				return runBulk(cmd, s, queue, asJSON, &bf, spec, "reschedule")
			}
			if by != "" {
				return usageErrorf("--by %q is for many tasks (with --match, --from, --to or --all): for one, --in or --at", by)
			}
			due, err := dueFlags(in, at, past, now, "move it due at once")
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("id") {
				if len(args) > 0 {
					return usageErrorf("--id %q and a BODY (%q) do not go together: a task with an id is moved by its id", id, args[0])
				}
				return rescheduleID(cmd, s, asJSON, queue, id, due)
			}
			if len(args) != 1 {
				return usageErrorf("want one BODY, or - to read it from stdin, or bulk flags (--match, --from, --to, --all); got %d arguments", len(args))
			}
			t, done, err := openTask(cmd, s, asJSON, queue, args[0], raw)
			if err != nil {
				return err
			}
			defer done()
			se, q, body := t.se, t.q, t.body
			err = t.p.Reschedule(t.ctx, body, due)
			if errors.Is(err, shard.ErrNotPending) {
				se.print(map[string]any{"queue": q.Name, "rescheduled": false}, func(io.Writer) {})
				return failure(fmt.Errorf("not pending on %s (never scheduled, cancelled, or already claimed): nothing changed", q.Name))
			}
			if err != nil {
				return se.redisFailure(err)
			}
			res := map[string]any{"queue": q.Name, "rescheduled": true, "due_ms": due.UnixMilli(),
				"message_id": shard.MessageID(body, due.UnixMilli())}
			se.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "rescheduled on %s, due %s, message_id %s\n", q.Name,
					due.UTC().Format("2006-01-02 15:04:05.000Z"), res["message_id"])
			})
			return nil
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.StringVar(&in, "in", "", "one task: due in this `DURATION` (Go syntax: 90s, 10m, 2h)")
	fs.StringVar(&at, "at", "", "due at this `TIME`")
	fs.StringVar(&by, "by", "", "bulk: shift each due time by this `DURATION` (-1h: earlier)")
	fs.BoolVar(&past, "past", false, "accept a due time in the past (--in, --at): the task goes out at once")
	fs.BoolVar(&raw, "raw", false, "keep stdin's bytes as they are, trailing newline too")
	fs.StringVar(&id, "id", "", "move the task with this `ID`")
	bf.add(fs)
	jsonFlag(fs, &asJSON)
	return cmd
}

// rescheduleID is reschedule --id.
func rescheduleID(cmd *cobra.Command, s streams, asJSON bool, queue, id string, due time.Time) error {
	t, done, err := openIDTask(cmd, s, asJSON, queue, id)
	if err != nil {
		return err
	}
	defer done()
	moved, err := t.p.RescheduleID(t.ctx, []byte(id), due)
	if errors.Is(err, shard.ErrNotPending) {
		t.se.print(map[string]any{"queue": t.q.Name, "id": id, "rescheduled": false, "pending": false}, func(io.Writer) {})
		return notPendingID(t.q, id)
	}
	if err != nil {
		return t.se.redisFailure(err)
	}
	res := map[string]any{"queue": t.q.Name, "id": id, "rescheduled": moved, "pending": true, "due_ms": due.UnixMilli(),
		"message_id": shard.MessageID([]byte(id), due.UnixMilli())}
	t.se.print(res, func(w io.Writer) {
		verb := "rescheduled"
		if !moved {
			verb = "already due then"
		}
		fmt.Fprintf(w, "%s on %s, due %s, message_id %s\n", verb, t.q.Name,
			due.UTC().Format("2006-01-02 15:04:05.000Z"), res["message_id"])
	})
	return nil
}

// bulkMove completes a bulk reschedule's spec with --by or --at.
func bulkMove(spec bulk.Spec, by, at string, past bool, now time.Time) (bulk.Spec, error) {
	switch {
	case (by == "") == (at == ""):
		return spec, usageErrorf("give one of --by (a duration, e.g. 30m or -1h) or --at (%s)", timeHelp)
	case by != "":
		d, err := time.ParseDuration(strings.TrimPrefix(by, "+"))
		if err != nil {
			return spec, usageErrorf("--by %q: not a duration (Go syntax such as 90s, -10m, 2h)", by)
		}
		if d.Milliseconds() == 0 {
			return spec, usageErrorf("--by %q: shifts by less than a ms: nothing would change", by)
		}
		spec.Mode, spec.ByMs = bulk.By, d.Milliseconds()
	default:
		ms, err := parseTime("at", at, now)
		if err != nil {
			return spec, err
		}
		if ms < now.UnixMilli() && !past {
			return spec, usageErrorf("--at %q is %s ago: add --past to move the tasks due at once", at,
				now.Sub(time.UnixMilli(ms)).Round(time.Second))
		}
		spec.Mode, spec.AtMs = bulk.At, ms
	}
	return spec, nil
}
