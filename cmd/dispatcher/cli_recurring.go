package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/recurring"
	"github.com/dispatcher/dispatcher/shard"
)

func newRecurringCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "recurring add|list|remove|pause|resume|check",
		Short: "cron schedules: one task per occurrence",
		Long: `A recurring schedule makes each occurrence an ordinary task of queue Q
with body BODY, due at the occurrence (message_id XXH64(BODY)-due_ms), once
per occurrence whatever the number of instances. Schedules in
DISPATCHER_RECURRING_FILE are changed there, not here (pause and resume work
on both). See docs/recurring.md.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("want add, list, remove, pause, resume or check, not %q", args[0])
			}
			return usageErrorf("want add, list, remove, pause, resume or check")
		},
		RunE: func(cmd *cobra.Command, args []string) error { return nil },
	}
	cmd.AddCommand(newRecurringAddCmd(s), newRecurringListCmd(s), newRecurringCheckCmd(s))
	for _, verb := range []string{"remove", "pause", "resume"} {
		cmd.AddCommand(newRecurringChangeCmd(s, verb))
	}
	return cmd
}

// recurringSession opens Redis for a schedule of queue (which must be one
// of DISPATCHER_QUEUES, if that is set).
func recurringSession(s streams, asJSON bool, queue, name string) (*session, *recurring.Store, error) {
	switch {
	case queue == "":
		return nil, nil, usageErrorf("--queue is required")
	case !shard.ValidQueueName(queue):
		return nil, nil, usageErrorf("--queue %q: want 1 to 64 characters of A-Z a-z 0-9 _ . -", queue)
	case name == "":
		return nil, nil, usageErrorf("--name is required")
	}
	se, err := openSession(s, asJSON, queue)
	if err != nil {
		return nil, nil, err
	}
	if len(se.cfg.Queues) > 0 && !slices.Contains(se.cfg.Queues, queue) {
		se.close()
		return nil, nil, usageErrorf("--queue %q: not one of DISPATCHER_QUEUES (%s)", queue, strings.Join(se.cfg.Queues, ", "))
	}
	return se, recurring.NewStore(se.rdb, shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: queue}), nil
}

func newRecurringAddCmd(s streams) *cobra.Command {
	var queue, name, expr, tz, catchup, grace string
	var props, routingKey, contentType string
	var headers []string
	var asJSON, raw bool
	cmd := &cobra.Command{
		Use:   "add --queue Q --name N --cron EXPR [flags] (BODY | -)",
		Short: "add or change a recurring schedule",
		Long: `Adds schedule N of queue Q, or changes it. EXPR is a 5-field cron
expression (minute hour day month weekday), 6 fields with seconds first,
@daily and the like, or @every 30s; --tz an IANA zone (default UTC), read
with its daylight saving changes. --catchup says what happens to
occurrences missed while no instance ran for longer than --grace: fire only
the latest (default), all of them, or skip them.
` + bodyHelp + `
Each occurrence may carry message properties: --props takes their JSON
object (routing_key, headers, content_type, priority, expiration_ms and the
others of CONTRACT.md; not deadline_ms, a fixed time that would
dead-letter every occurrence after it); --header, --routing-key and
--content-type set one each. Without them occurrences have none.

Exit status: 0 saved, 1 Redis failed, 2 bad arguments or schedule.`,
		Example: `  dispatcher recurring add --queue reports --name nightly \
    --cron '0 2 * * *' --tz Europe/Berlin '{"report":"daily"}'
  dispatcher recurring add --queue reports --name hourly --cron @hourly \
    --props '{"content_type":"application/json","expiration_ms":600000}' \
    --header tenant=acme '{"report":"hourly"}'`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("want one BODY, or - to read it from stdin; got %d arguments", len(args))
			}
			if expr == "" {
				return usageErrorf("--cron is required")
			}
			se, st, err := recurringSession(s, asJSON, queue, name)
			if err != nil {
				return err
			}
			defer se.close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			body, err := readBody(args[0], s.stdin, se.cfg.MaxMessageBytes, raw)
			if err != nil {
				return err
			}
			if len(body) > se.cfg.MaxMessageBytes {
				return usageErrorf("the body is over DISPATCHER_MAX_MESSAGE_BYTES=%d bytes: it would go straight to the dead letters", se.cfg.MaxMessageBytes)
			}
			pj, err := recurringProps(props, headers, routingKey, contentType)
			if err != nil {
				return err
			}
			d := recurring.Def{Queue: queue, Name: name, Cron: expr, TZ: tz, Body: string(body), Properties: pj, CatchUp: catchup, Grace: grace, Source: "cli"}
			if _, err := recurring.Parse(d); err != nil {
				return usageErrorf("%v", err)
			}
			defs, _, err := st.Defs(ctx)
			if err != nil {
				return se.redisFailure(err)
			}
			for _, o := range defs {
				switch {
				case o.Name == d.Name && o.Source == recurring.FileSource:
					return usageErrorf("schedule %s/%s comes from DISPATCHER_RECURRING_FILE: change it there", d.Queue, d.Name)
				case o.Name == d.Name:
					d.Paused = o.Paused
				case o.Body == d.Body:
					return usageErrorf("schedule %s/%s has the same body: two schedules of one queue need different bodies (a sorted set holds a member once)", o.Queue, o.Name)
				}
			}
			changed, err := st.Put(ctx, d)
			if err != nil {
				return se.redisFailure(err)
			}
			se.print(map[string]any{"queue": d.Queue, "name": d.Name, "changed": changed}, func(w io.Writer) {
				if changed {
					fmt.Fprintf(w, "recurring schedule %s/%s saved: the queue's sweeping instance materialises it within a second\n", d.Queue, d.Name)
				} else {
					fmt.Fprintf(w, "recurring schedule %s/%s unchanged\n", d.Queue, d.Name)
				}
			})
			return nil
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.StringVar(&name, "name", "", "the schedule's `N`ame (required)")
	fs.StringVar(&expr, "cron", "", "when: a cron `EXPR`, @daily, @every 30s")
	fs.StringVar(&tz, "tz", "", "the `ZONE` the expression is read in (default UTC)")
	fs.StringVar(&catchup, "catchup", "", "what to fire of missed occurrences, a `POLICY`: latest (default), all or skip")
	fs.StringVar(&grace, "grace", "", "how late, a `DURATION`, an occurrence may be and still count as on time (default 10s)")
	fs.BoolVar(&raw, "raw", false, "keep stdin's bytes as they are, trailing newline too")
	fs.StringVar(&props, "props", "", "each occurrence's message properties, a `JSON` object (CONTRACT.md)")
	fs.StringArrayVar(&headers, "header", nil, "a header of each occurrence, `NAME=VALUE` (repeatable): VALUE true/false is a boolean, an integer an integer, anything else a string")
	fs.StringVar(&routingKey, "routing-key", "", "publish each occurrence with routing `KEY` instead of the queue's")
	fs.StringVar(&contentType, "content-type", "", "each occurrence's AMQP content `TYPE`")
	jsonFlag(fs, &asJSON)
	return cmd
}

// recurringProps is a schedule's properties from --props and the flags
// that set one field each (a field given both ways is refused), validated
// as a schedule takes them; "" for none.
func recurringProps(propsJSON string, headers []string, routingKey, contentType string) (recurring.PropsJSON, error) {
	m := map[string]any{}
	if propsJSON != "" {
		if _, _, err := recurring.ParseProps(propsJSON); err != nil {
			return "", usageErrorf("--props: %v", err)
		}
		dec := json.NewDecoder(strings.NewReader(propsJSON))
		dec.UseNumber() // integers stay exact
		if err := dec.Decode(&m); err != nil {
			return "", usageErrorf("--props: %v", err)
		}
	}
	set := func(flag, field string, v any) error {
		if _, ok := m[field]; ok {
			return usageErrorf("--%s: %s is given in --props too", flag, field)
		}
		m[field] = v
		return nil
	}
	for _, f := range []struct{ flag, field, v string }{{"routing-key", "routing_key", routingKey}, {"content-type", "content_type", contentType}} {
		if f.v == "" {
			continue
		}
		if err := set(f.flag, f.field, f.v); err != nil {
			return "", err
		}
	}
	if len(headers) > 0 {
		h, _ := m["headers"].(map[string]any)
		if h == nil {
			h = map[string]any{}
		}
		if err := addHeaders(h, headers); err != nil {
			return "", err
		}
		m["headers"] = h
	}
	if len(m) == 0 {
		return "", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", usageErrorf("properties: %v", err)
	}
	p, _, err := recurring.ParseProps(string(b))
	if err != nil {
		return "", usageErrorf("%v", err)
	}
	return p, nil
}

func newRecurringChangeCmd(s streams, verb string) *cobra.Command {
	var queue, name string
	var asJSON bool
	past := map[string]string{"remove": "removed", "pause": "paused", "resume": "resumed"}[verb]
	cmd := &cobra.Command{
		Use:   verb + " --queue Q --name N",
		Short: map[string]string{"remove": "remove a recurring schedule", "pause": "stop a schedule's occurrences", "resume": "let a paused schedule fire again"}[verb],
		Long: `Exit status: 0 done, 1 no such schedule or Redis failed, 2 bad
arguments.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			se, st, err := recurringSession(s, asJSON, queue, name)
			if err != nil {
				return err
			}
			defer se.close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			var changed bool
			if verb == "remove" {
				defs, _, err := st.Defs(ctx)
				if err != nil {
					return se.redisFailure(err)
				}
				for _, o := range defs {
					if o.Name == name && o.Source == recurring.FileSource {
						return usageErrorf("schedule %s/%s comes from DISPATCHER_RECURRING_FILE: remove it there", queue, name)
					}
				}
				changed, err = st.Remove(ctx, name)
			} else {
				changed, err = st.SetPaused(ctx, name, verb == "pause")
			}
			if errors.Is(err, recurring.ErrNotFound) {
				return failure(err)
			}
			if err != nil {
				return se.redisFailure(err)
			}
			se.print(map[string]any{"queue": queue, "name": name, "changed": changed}, func(w io.Writer) {
				if !changed {
					fmt.Fprintf(w, "recurring schedule %s/%s already %s\n", queue, name, past)
					return
				}
				fmt.Fprintf(w, "recurring schedule %s/%s %s\n", queue, name, past)
			})
			return nil
		},
	}
	queueFlag(cmd.Flags(), &queue)
	cmd.Flags().StringVar(&name, "name", "", "the schedule's `N`ame (required)")
	jsonFlag(cmd.Flags(), &asJSON)
	return cmd
}

func newRecurringCheckCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "validate a schedule file, without Redis",
		Long:  `Exit status: 0 valid, 1 unreadable, 2 not valid (one line per problem).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("want the FILE to check")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return failure(err)
			}
			f, err := recurring.ParseFile(b)
			if err != nil {
				return settingsError(fmt.Errorf("%s: %v", args[0], err))
			}
			var bad []string
			for _, d := range f.Schedules {
				if _, err := recurring.Parse(d); err != nil {
					bad = append(bad, err.Error())
				}
			}
			if len(bad) > 0 {
				for _, b := range bad[:len(bad)-1] {
					fmt.Fprintf(s.stderr, "dispatcher recurring check: %s\n", b)
				}
				return settingsError(errors.New(bad[len(bad)-1]))
			}
			fmt.Fprintf(s.stdout, "%s: %s, all valid\n", args[0], plural(len(f.Schedules), "schedule", "schedules"))
			return nil
		},
	}
}

func newRecurringListCmd(s streams) *cobra.Command {
	var queues []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--queue Q]... [--json]",
		Short: "the recurring schedules, their state, last and next occurrence",
		Long: `Lists the schedules of the queues given with --queue, else
DISPATCHER_QUEUES, else every queue recorded in Redis. A schedule of a queue
no instance serves is shown as failing: nothing materialises it.

Exit status: 0 listed, 1 Redis failed, 2 bad arguments or settings (a Redis
user without SCAN, given no queue).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			se, ctx, names, done, err := openQueues(cmd, s, asJSON, queues, 10*time.Second)
			if err != nil {
				return err
			}
			defer done()
			var all []recurring.Entry
			for _, q := range names {
				keys := shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: q}
				es, err := recurring.NewStore(se.rdb, keys).List(ctx)
				if err != nil {
					return se.redisFailure(err)
				}
				// Only the queue's sweeping instance materialises: with
				// none, no schedule of the queue goes on.
				served := se.rdb.Get(ctx, keys.Sweeper()).Err() == nil
				for _, e := range es {
					e.Queue = q
					if !served {
						if e.Status == nil {
							e.Status = &recurring.Status{Home: -1}
						}
						if e.Status.Error == "" {
							e.Status.Error = fmt.Sprintf("no instance serves queue %s (no sweeper): nothing is materialised", q)
						}
					}
					all = append(all, e)
				}
			}
			if all == nil {
				all = []recurring.Entry{}
			}
			se.print(map[string]any{"recurring": all}, func(w io.Writer) { writeRecurring(w, all) })
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&queues, "queue", "q", nil, "only queue `Q`; may be repeated")
	jsonFlag(cmd.Flags(), &asJSON)
	return cmd
}

func writeRecurring(w io.Writer, all []recurring.Entry) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tNAME\tCRON\tTZ\tSTATE\tLAST (UTC)\tNEXT (UTC)\tCATCHUP\tFROM\tBODY")
	for _, e := range all {
		v := recurringRow(e)
		tz := v.TZ
		if tz == "" {
			tz = "UTC"
		}
		state := "active"
		switch {
		case v.Error != "":
			state = "FAILING: " + v.Error
		case v.Paused:
			state = "paused"
		}
		next := fmtMs(v.NextMs)
		if v.Paused {
			next = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Queue, v.Name, v.Cron, tz, state, fmtMs(v.LastMs), next, v.CatchUp, v.Source, shortBody(e.Body, bodyWidth))
	}
	tw.Flush()
	fmt.Fprintln(w, plural(len(all), "recurring schedule", "recurring schedules"))
}
