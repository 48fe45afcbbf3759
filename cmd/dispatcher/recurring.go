package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/statuspage"
	"github.com/dispatcher/dispatcher/recurring"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

const recurringUsage = `usage:
  dispatcher recurring add    --queue Q --name N --cron EXPR [--tz ZONE] [--catchup latest|all|skip] [--grace 10s] [--json] (BODY | -)
  dispatcher recurring list   [--queue Q] [--json]
  dispatcher recurring remove --queue Q --name N [--json]
  dispatcher recurring pause  --queue Q --name N [--json]
  dispatcher recurring resume --queue Q --name N [--json]
  dispatcher recurring check  FILE

A recurring schedule makes each occurrence an ordinary task of queue Q with
body BODY, due at the occurrence (message_id XXH64(BODY)-due_ms), once per
occurrence whatever the number of instances. EXPR is a 5-field cron
expression (minute hour day month weekday), 6 fields with seconds first,
@daily and the like, or @every 30s; --tz an IANA zone (default UTC), read
with its daylight saving changes. --catchup says what happens to occurrences
missed while no instance ran for longer than --grace: fire only the latest
(default), all of them, or skip them. add changes a schedule of that name.
Schedules in DISPATCHER_RECURRING_FILE are changed there, not here (pause and
resume work on both). check validates a schedule file and exits. The settings
come from the environment, as for the daemon. See docs/recurring.md.
`

func runRecurring(args []string, stdout, stderr io.Writer) int {
	verbs := []string{"add", "list", "remove", "pause", "resume", "check"}
	if len(args) == 0 || !slices.Contains(verbs, args[0]) {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stdout, recurringUsage)
			return exitOK
		}
		fmt.Fprintln(stderr, "dispatcher recurring: want add, list, remove, pause, resume or check (see dispatcher recurring --help)")
		return exitSettings
	}
	verb := args[0]
	c := &cli{name: "recurring " + verb, usage: recurringUsage, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	queue := fs.String("queue", "", "")
	name := fs.String("name", "", "")
	expr := fs.String("cron", "", "")
	tz := fs.String("tz", "", "")
	catchup := fs.String("catchup", "", "")
	grace := fs.String("grace", "", "")
	if code, ok := c.parse(fs, args[1:]); !ok {
		return code
	}
	if verb == "check" {
		return c.checkFile(fs)
	}
	if verb != "add" && (*expr != "" || *tz != "" || *catchup != "" || *grace != "") {
		return c.usageErr("--cron, --tz, --catchup and --grace are for add")
	}
	switch {
	case *queue == "" && verb != "list":
		return c.usageErr("--queue is required")
	case *name == "" && verb != "list":
		return c.usageErr("--name is required")
	case verb != "add" && fs.NArg() > 0:
		return c.usageErr("unexpected argument %q", fs.Arg(0))
	}
	if code, ok := c.connect(); !ok {
		return code
	}
	defer c.close()
	queues := c.cfg.Queues
	if *queue != "" {
		if code, ok := c.knownQueue(*queue); !ok {
			return code
		}
		queues = []string{*queue}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := recurring.NewStore(c.rdb, shard.Keys{Prefix: c.cfg.KeyPrefix, Queue: *queue})
	switch verb {
	case "list":
		return c.listRecurring(ctx, queues)
	case "add":
		if fs.NArg() != 1 {
			return c.usageErr("want one BODY, or - to read it from stdin; got %d arguments", fs.NArg())
		}
		body := fs.Arg(0)
		if body == "-" {
			b, err := io.ReadAll(io.LimitReader(os.Stdin, int64(c.cfg.MaxMessageBytes)+1))
			if err != nil {
				return c.fail(fmt.Errorf("read the body from stdin: %w", err))
			}
			body = string(b)
		}
		if len(body) > c.cfg.MaxMessageBytes {
			return c.usageErr("the body is over DISPATCHER_MAX_MESSAGE_BYTES=%d bytes: it would go straight to the dead letters", c.cfg.MaxMessageBytes)
		}
		d := recurring.Def{Queue: *queue, Name: *name, Cron: *expr, TZ: *tz, Body: body, CatchUp: *catchup, Grace: *grace, Source: "cli"}
		if *expr == "" {
			return c.usageErr("--cron is required")
		}
		if _, err := recurring.Parse(d); err != nil {
			return c.usageErr("%v", err)
		}
		defs, _, err := st.Defs(ctx)
		if err != nil {
			return c.fail(err)
		}
		for _, o := range defs {
			switch {
			case o.Name == d.Name && o.Source == recurring.FileSource:
				return c.usageErr("schedule %s/%s comes from DISPATCHER_RECURRING_FILE: change it there", d.Queue, d.Name)
			case o.Name == d.Name:
				d.Paused = o.Paused
			case o.Body == d.Body:
				return c.usageErr("schedule %s/%s has the same body: two schedules of one queue need different bodies (a sorted set holds a member once)", o.Queue, o.Name)
			}
		}
		changed, err := st.Put(ctx, d)
		if err != nil {
			return c.fail(err)
		}
		c.print(map[string]any{"queue": d.Queue, "name": d.Name, "changed": changed}, func(w io.Writer) {
			if changed {
				fmt.Fprintf(w, "recurring schedule %s/%s saved: the queue's sweeping instance materialises it within a second\n", d.Queue, d.Name)
			} else {
				fmt.Fprintf(w, "recurring schedule %s/%s unchanged\n", d.Queue, d.Name)
			}
		})
		return exitOK
	}
	var changed bool
	var err error
	switch verb {
	case "remove":
		var defs []recurring.Def
		if defs, _, err = st.Defs(ctx); err != nil {
			return c.fail(err)
		}
		for _, o := range defs {
			if o.Name == *name && o.Source == recurring.FileSource {
				return c.usageErr("schedule %s/%s comes from DISPATCHER_RECURRING_FILE: remove it there", *queue, *name)
			}
		}
		changed, err = st.Remove(ctx, *name)
	default:
		changed, err = st.SetPaused(ctx, *name, verb == "pause")
	}
	if errors.Is(err, recurring.ErrNotFound) {
		fmt.Fprintf(c.stderr, "dispatcher %s: %v\n", c.name, err)
		return exitFailure
	}
	if err != nil {
		return c.fail(err)
	}
	c.print(map[string]any{"queue": *queue, "name": *name, "changed": changed}, func(w io.Writer) {
		past := map[string]string{"remove": "removed", "pause": "paused", "resume": "resumed"}[verb]
		if !changed {
			fmt.Fprintf(w, "recurring schedule %s/%s already %s\n", *queue, *name, past)
			return
		}
		fmt.Fprintf(w, "recurring schedule %s/%s %s\n", *queue, *name, past)
	})
	return exitOK
}

// checkFile validates a schedule file without touching Redis.
func (c *cli) checkFile(fs *flag.FlagSet) int {
	if fs.NArg() != 1 {
		return c.usageErr("want the FILE to check")
	}
	b, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return c.fail(err)
	}
	f, err := recurring.ParseFile(b)
	if err != nil {
		fmt.Fprintf(c.stderr, "dispatcher %s: %s: %v\n", c.name, fs.Arg(0), err)
		return exitSettings
	}
	bad := 0
	for _, d := range f.Schedules {
		if _, err := recurring.Parse(d); err != nil {
			fmt.Fprintf(c.stderr, "dispatcher %s: %v\n", c.name, err)
			bad++
		}
	}
	if bad > 0 {
		return exitSettings
	}
	fmt.Fprintf(c.stdout, "%s: %d schedules, all valid\n", fs.Arg(0), len(f.Schedules))
	return exitOK
}

func (c *cli) listRecurring(ctx context.Context, queues []string) int {
	var all []recurring.Entry
	for _, q := range queues {
		keys := shard.Keys{Prefix: c.cfg.KeyPrefix, Queue: q}
		es, err := recurring.NewStore(c.rdb, keys).List(ctx)
		if err != nil {
			return c.fail(err)
		}
		// Only the queue's sweeping instance materialises: with none, no
		// schedule of the queue goes on, and the list must say so.
		served := c.rdb.Get(ctx, keys.Sweeper()).Err() == nil
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
	c.print(map[string]any{"recurring": all}, func(w io.Writer) {
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
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%q\n", v.Queue, v.Name, v.Cron, tz, state, fmtMs(v.LastMs), next, v.CatchUp, v.Source, e.Body)
		}
		tw.Flush()
		fmt.Fprintf(w, "%d recurring schedules\n", len(all))
	})
	return exitOK
}

func fmtMs(v int64) string {
	if v == 0 {
		return "-"
	}
	return time.UnixMilli(v).UTC().Format("2006-01-02 15:04:05.000")
}

// recurringRow is a schedule as the status page and the list show it.
func recurringRow(e recurring.Entry) statuspage.Recurring {
	r := statuspage.Recurring{Queue: e.Queue, Name: e.Name, Cron: e.Cron, TZ: e.TZ, CatchUp: e.CatchUp, Source: e.Source, Paused: e.Paused}
	if r.CatchUp == "" {
		r.CatchUp = recurring.CatchUpLatest
	}
	if e.Status != nil {
		r.NextMs, r.LastMs, r.Error = e.Status.NextMs, e.Status.LastMs, e.Status.Error
	}
	return r
}

// recurringView reads the served queues' schedules for the status page.
func recurringView(rdb redis.UniversalClient, cfg *config.Settings) func(context.Context) []statuspage.Recurring {
	return func(ctx context.Context) []statuspage.Recurring {
		var out []statuspage.Recurring
		for _, q := range cfg.Queues {
			es, err := recurring.NewStore(rdb, shard.Keys{Prefix: cfg.KeyPrefix, Queue: q}).List(ctx)
			if err != nil {
				continue // the page shows Redis's problems on its own
			}
			for _, e := range es {
				e.Queue = q
				out = append(out, recurringRow(e))
			}
		}
		return out
	}
}

// startRecurring runs a materialiser per queue (working while this
// instance sweeps the queue) and, with DISPATCHER_RECURRING_FILE, the
// file's watcher; wg waits for them.
func startRecurring(ctx context.Context, wg *sync.WaitGroup, rdb redis.UniversalClient, cfg *config.Settings,
	byQueue map[string]*scanner.Queue, reg prometheus.Registerer, log *slog.Logger) {
	met := recurring.NewMetrics(reg)
	for _, q := range cfg.QueueSettings {
		sq := byQueue[q.Name]
		m := recurring.New(rdb, recurring.Options{Keys: shard.Keys{Prefix: cfg.KeyPrefix, Queue: q.Name},
			Sweeping: sq.Sweeping, Layout: sq.Layout, Metrics: met, Logger: log.With("component", "recurring")})
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.Run(ctx) }()
	}
	if cfg.RecurringFile != "" {
		w := recurring.NewWatcher(cfg.RecurringFile, recurring.NewReconciler(rdb, cfg.KeyPrefix, cfg.Queues, log.With("component", "recurring-file")), log.With("component", "recurring-file"))
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
}
