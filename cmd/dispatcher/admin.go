package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/admin"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

const adminUsage = `usage:
  dispatcher schedule --queue Q (--in 10m | --at 2026-11-23T18:00:00Z) [--json] (BODY | -)
  dispatcher cancel   --queue Q [--json] BODY
  dispatcher dead list    --queue Q [--shard i] [--json]
  dispatcher dead requeue --queue Q [--shard i] [--now] [--json] (--all | BODY...)
  dispatcher dead purge   --queue Q [--shard i] --yes [--json] (--all | BODY...)
  dispatcher pause  --queue Q
  dispatcher resume --queue Q

The settings come from the environment, as for the daemon (DISPATCHER_REDIS_URL,
DISPATCHER_KEY_PREFIX, DISPATCHER_QUEUES, DISPATCHER_QUEUE_<NAME>_SHARDS, ...).
BODY - reads the body from stdin. A requeued dead letter keeps its due time, and
so its message_id, unless --now. A paused queue claims nothing, on every
instance, until resumed. Exit status: 0 done, 1 Redis failed or nothing to do
(not pending, not dead), 2 bad arguments or settings.
`

// cli is one command's context: its settings, queue and Redis.
type cli struct {
	name   string
	usage  string // printed by --help
	stdout io.Writer
	stderr io.Writer
	cfg    *config.Settings
	queue  config.Queue
	q      admin.Queue
	rdb    redis.UniversalClient
	json   bool
}

// usageErr prints one line and returns exitSettings.
func (c *cli) usageErr(format string, args ...any) int {
	fmt.Fprintf(c.stderr, "dispatcher %s: %s (see dispatcher %s --help)\n", c.name, fmt.Sprintf(format, args...), strings.Fields(c.name)[0])
	return exitSettings
}

func (c *cli) fail(err error) int {
	fmt.Fprintf(c.stderr, "dispatcher %s: %v\n", c.name, redact.Error(err))
	if redisconn.Permanent(err) {
		return exitSettings // settings Redis refuses, e.g. an ACL without a command
	}
	return exitFailure
}

// parse parses args into fs, --json included.
func (c *cli) parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	fs.BoolVar(&c.json, "json", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(c.stdout, c.usage)
			return exitOK, false
		}
		return c.usageErr("%v", err), false
	}
	return 0, true
}

// connect loads the settings from the environment and opens Redis.
func (c *cli) connect() (code int, ok bool) {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(c.stderr, "dispatcher %s: %v\n", c.name, err)
		return exitSettings, false
	}
	ropt, err := redisOptions(cfg)
	if err != nil {
		fmt.Fprintf(c.stderr, "dispatcher %s: %v\n", c.name, err)
		return exitSettings, false
	}
	c.cfg, c.rdb = cfg, ropt.NewClient()
	// Settings Redis refuses (a wrong password, a database it lacks) are
	// bad settings, said as the daemon says them; other trouble is left to
	// the command, which reports what it could not do.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var refused *redisconn.RefusedError
	if err := redisconn.Check(ctx, c.rdb); errors.As(err, &refused) {
		c.close()
		fmt.Fprintf(c.stderr, "dispatcher %s: %v\n", c.name, redisRefusal(cfg, refused))
		return exitSettings, false
	}
	return 0, true
}

// knownQueue reports whether name is one of DISPATCHER_QUEUES, saying so
// if not.
func (c *cli) knownQueue(name string) (code int, ok bool) {
	if !slices.Contains(c.cfg.Queues, name) {
		return c.usageErr("--queue %q: not one of DISPATCHER_QUEUES (%s)", name, strings.Join(c.cfg.Queues, ", ")), false
	}
	return 0, true
}

// open parses fs, loads the settings and opens Redis for --queue, whose
// shard count it checks against the one recorded in Redis.
func (c *cli) open(fs *flag.FlagSet, args []string, queue *string) (code int, ok bool) {
	c.usage = adminUsage
	if code, ok := c.parse(fs, args); !ok {
		return code, false
	}
	if *queue == "" {
		return c.usageErr("--queue is required"), false
	}
	if code, ok := c.connect(); !ok {
		return code, false
	}
	if code, ok := c.knownQueue(*queue); !ok {
		c.close()
		return code, false
	}
	for _, q := range c.cfg.QueueSettings {
		if q.Name == *queue {
			c.queue = q
		}
	}
	c.q = admin.Queue{Keys: shard.Keys{Prefix: c.cfg.KeyPrefix, Queue: c.queue.Name}, Shards: c.queue.Shards}
	// The shard count the daemon recorded: with another one, pause would
	// miss shards and schedule would pick the wrong one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shard.EnsureShardCount(ctx, c.rdb, c.q.Keys, c.queue.Shards); err != nil {
		c.close()
		var sce *shard.ShardCountError
		if errors.As(err, &sce) {
			fmt.Fprintf(c.stderr, "dispatcher %s: %v (DISPATCHER_QUEUE_%s_SHARDS=%d)\n", c.name, err, config.EnvName(c.queue.Name), c.queue.Shards)
			return exitSettings, false
		}
		return c.fail(err), false
	}
	return 0, true
}

func (c *cli) close() {
	if c.rdb != nil {
		c.rdb.Close()
	}
}

func (c *cli) print(v any, human func(w io.Writer)) {
	if c.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
		return
	}
	human(c.stdout)
}

func runSchedule(args []string, stdout, stderr io.Writer) int {
	c := &cli{name: "schedule", stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("schedule", flag.ContinueOnError)
	queue := fs.String("queue", "", "")
	in := fs.String("in", "", "")
	at := fs.String("at", "", "")
	if code, ok := c.open(fs, args, queue); !ok {
		return code
	}
	defer c.close()
	var due time.Time
	switch {
	case (*in == "") == (*at == ""):
		return c.usageErr("give one of --in (a duration, e.g. 10m) or --at (RFC 3339, e.g. 2026-11-23T18:00:00Z)")
	case *in != "":
		d, err := time.ParseDuration(*in)
		if err != nil {
			return c.usageErr("--in %q: not a duration (use Go syntax such as 90s, 10m, 2h)", *in)
		}
		due = time.Now().Add(d)
	default:
		t, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			return c.usageErr("--at %q: not an RFC 3339 time (e.g. 2026-11-23T18:00:00Z)", *at)
		}
		due = t
	}
	if fs.NArg() != 1 {
		return c.usageErr("want one BODY, or - to read it from stdin; got %d arguments", fs.NArg())
	}
	body := []byte(fs.Arg(0))
	if fs.Arg(0) == "-" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, int64(c.cfg.MaxMessageBytes)+1))
		if err != nil {
			return c.fail(fmt.Errorf("read the body from stdin: %w", err))
		}
		body = b
	}
	if len(body) > c.cfg.MaxMessageBytes {
		return c.usageErr("the body is over DISPATCHER_MAX_MESSAGE_BYTES=%d bytes: it would go straight to the dead letters", c.cfg.MaxMessageBytes)
	}
	p, err := shard.NewProducer(c.rdb, c.cfg.KeyPrefix, c.queue.Name, c.queue.Shards)
	if err != nil {
		return c.fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Schedule(ctx, body, due); err != nil {
		return c.fail(err)
	}
	res := map[string]any{"queue": c.queue.Name, "shard": shard.Index(body, c.queue.Shards), "due_ms": due.UnixMilli(),
		"message_id": shard.MessageID(body, due.UnixMilli())}
	c.print(res, func(w io.Writer) {
		fmt.Fprintf(w, "scheduled on %s shard %d, due %s, message_id %s\n", c.queue.Name, res["shard"],
			due.UTC().Format("2006-01-02 15:04:05.000Z"), res["message_id"])
	})
	return exitOK
}

func runCancel(args []string, stdout, stderr io.Writer) int {
	c := &cli{name: "cancel", stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	queue := fs.String("queue", "", "")
	if code, ok := c.open(fs, args, queue); !ok {
		return code
	}
	defer c.close()
	if fs.NArg() != 1 {
		return c.usageErr("want one BODY; got %d arguments", fs.NArg())
	}
	p, err := shard.NewProducer(c.rdb, c.cfg.KeyPrefix, c.queue.Name, c.queue.Shards)
	if err != nil {
		return c.fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := p.Cancel(ctx, []byte(fs.Arg(0)))
	if err != nil {
		return c.fail(err)
	}
	c.print(map[string]any{"queue": c.queue.Name, "cancelled": ok}, func(w io.Writer) {
		if ok {
			fmt.Fprintln(w, "cancelled")
		}
	})
	if !ok {
		fmt.Fprintf(stderr, "dispatcher cancel: not pending on %s (never scheduled, cancelled, or already claimed): nothing changed\n", c.queue.Name)
		return exitFailure
	}
	return exitOK
}

func runPause(args []string, stdout, stderr io.Writer, pause bool) int {
	name := "resume"
	if pause {
		name = "pause"
	}
	c := &cli{name: name, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	queue := fs.String("queue", "", "")
	if code, ok := c.open(fs, args, queue); !ok {
		return code
	}
	defer c.close()
	if fs.NArg() != 0 {
		return c.usageErr("unexpected argument %q", fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if pause {
		err = admin.Pause(ctx, c.rdb, c.q, time.Now().UnixMilli())
	} else {
		err = admin.Resume(ctx, c.rdb, c.q)
	}
	if err != nil {
		return c.fail(err)
	}
	c.print(map[string]any{"queue": c.queue.Name, "paused": pause}, func(w io.Writer) {
		if pause {
			fmt.Fprintf(w, "queue %s paused: every instance claims nothing from it until `dispatcher resume --queue %s`\n", c.queue.Name, c.queue.Name)
		} else {
			fmt.Fprintf(w, "queue %s resumed\n", c.queue.Name)
		}
	})
	return exitOK
}

func runDead(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stdout, adminUsage)
			return exitOK
		}
		fmt.Fprintln(stderr, "dispatcher dead: want list, requeue or purge (see dispatcher dead --help)")
		return exitSettings
	}
	verb := args[0]
	switch verb {
	case "list", "requeue", "purge":
	default:
		fmt.Fprintf(stderr, "dispatcher dead: unknown command %q: want list, requeue or purge (see dispatcher dead --help)\n", verb)
		return exitSettings
	}
	c := &cli{name: "dead " + verb, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("dead "+verb, flag.ContinueOnError)
	queue := fs.String("queue", "", "")
	shardIdx := fs.Int("shard", -1, "")
	all := fs.Bool("all", false, "")
	now := fs.Bool("now", false, "")
	yes := fs.Bool("yes", false, "")
	if code, ok := c.open(fs, args[1:], queue); !ok {
		return code
	}
	defer c.close()
	if *shardIdx < -1 || *shardIdx >= c.queue.Shards {
		return c.usageErr("--shard %d: queue %s has shards 0 to %d", *shardIdx, c.queue.Name, c.queue.Shards-1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if verb == "list" {
		if fs.NArg() > 0 || *all || *now || *yes {
			return c.usageErr("list takes only --queue, --shard and --json")
		}
		dead, err := admin.DeadList(ctx, c.rdb, c.q, *shardIdx)
		if err != nil {
			return c.fail(err)
		}
		c.print(map[string]any{"queue": c.queue.Name, "dead": nonNil(dead)}, func(w io.Writer) {
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SHARD\tDUE (UTC)\tMESSAGE_ID\tBODY\tREASON")
			for _, d := range dead {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%q\t%s\n", d.Shard, time.UnixMilli(d.DueMs).UTC().Format("2006-01-02 15:04:05.000"), d.MessageID, d.Member, d.Reason)
			}
			tw.Flush()
			fmt.Fprintf(w, "%d dead letters\n", len(dead))
		})
		return exitOK
	}
	if *all == (fs.NArg() > 0) {
		return c.usageErr("give --all or the BODY of each dead letter, not both")
	}
	if verb == "purge" && !*yes {
		return c.usageErr("purge forgets tasks for good: add --yes (nothing changed)")
	}
	if verb == "purge" && *now {
		return c.usageErr("--now is for requeue")
	}
	var targets []admin.Dead
	var notDead []string
	if *all {
		d, err := admin.DeadList(ctx, c.rdb, c.q, *shardIdx)
		if err != nil {
			return c.fail(err)
		}
		targets = d
	} else {
		for _, b := range fs.Args() {
			d, err := admin.DeadOf(ctx, c.rdb, c.q, []byte(b))
			if err != nil {
				return c.fail(err)
			}
			if *shardIdx >= 0 && shard.Index([]byte(b), c.queue.Shards) != *shardIdx {
				d = nil
			}
			if len(d) == 0 {
				notDead = append(notDead, b)
			}
			targets = append(targets, d...)
		}
	}
	if len(notDead) > 0 {
		fmt.Fprintf(stderr, "dispatcher dead %s: not dead on %s: %q: nothing changed\n", verb, c.queue.Name, notDead)
		return exitFailure
	}
	var done []admin.Dead
	skipped := 0
	at := int64(0)
	if *now {
		at = time.Now().UnixMilli()
	}
	for _, d := range targets {
		var ok bool
		var err error
		if verb == "requeue" {
			ok, err = admin.Requeue(ctx, c.rdb, c.q, d, at)
			if errors.Is(err, admin.ErrPending) {
				fmt.Fprintf(stderr, "dispatcher dead requeue: %q (message_id %s): %v\n", d.Member, d.MessageID, err)
				skipped++
				continue
			}
			if ok && at != 0 {
				d.DueMs, d.MessageID = at, shard.MessageID([]byte(d.Member), at)
			}
		} else {
			ok, err = admin.Purge(ctx, c.rdb, c.q, d)
		}
		if err != nil {
			c.report(verb, done)
			return c.fail(err)
		}
		if ok {
			done = append(done, d)
		}
	}
	c.report(verb, done)
	if skipped > 0 {
		return exitFailure
	}
	return exitOK
}

// report prints what a dead requeue or purge did, also when it stopped
// part-way.
func (c *cli) report(verb string, done []admin.Dead) {
	past := map[string]string{"requeue": "requeued", "purge": "purged"}[verb]
	c.print(map[string]any{"queue": c.queue.Name, past: nonNil(done)}, func(w io.Writer) {
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
