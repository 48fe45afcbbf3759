package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/redact"
)

// Options are the bench's settings, from its flags.
type Options struct {
	RedisURL   string `json:"-"` // may hold a password: never written out
	AMQPURL    string `json:"-"`
	Dispatcher string `json:"-"` // executable started as the instances

	Modes    []string `json:"modes"`
	Backlogs []int    `json:"backlogs"`
	Window   int      `json:"window"`
	Drain    bool     `json:"drain"`
	Rates    []int    `json:"rates"`
	Duration Duration `json:"duration"`
	// Ahead is how long before its due time a rate point's task is
	// ZADDed; Wake sends the Go producer's wake-up after each ZADD.
	Ahead     Duration `json:"ahead"`
	Wake      bool     `json:"wake"`
	Idle      Duration `json:"idle_duration"`
	IdleTasks int      `json:"idle_pending"`
	Instances []int    `json:"instances"`
	Shards    []int    `json:"shards"`
	Batches   []int    `json:"batches"`
	Sizes     []int    `json:"sizes"`
	QueueType string   `json:"queue_type"`
	Cross     bool     `json:"cross"`
	// Queues is how many queues the instances of an idle or rate point
	// serve (list); backlog points serve one. A rate point spreads its
	// rate evenly over them.
	Queues []int `json:"queues"`

	// AutoAck consumes with auto-ack; otherwise (the default) each
	// delivery is acked on its own right after it is recorded, with at
	// most Prefetch unacked (0: no limit; always 0 with AutoAck).
	AutoAck  bool `json:"autoack"`
	Prefetch int  `json:"prefetch"`

	CeilingCount   int   `json:"ceiling_count"`
	CeilingWindows []int `json:"ceiling_windows"`
	CeilingEach    bool  `json:"ceiling_each"`

	// BurstLead is how far ahead of now a burst's one due time is set
	// (0: 10 s plus 1 s per 50,000 tasks); MaxRate the queue's MAX_RATE
	// in burst points (0: none).
	BurstLead Duration `json:"burst_lead"`
	MaxRate   int      `json:"max_rate"`
	// ProbeCPUs pins a burst's probe process (taskset -c), e.g. to the
	// CPU Redis has to itself.
	ProbeCPUs string `json:"probe_cpus,omitempty"`

	// IDs is how tasks are scheduled, swept like the other lists: false
	// as plain members (ZADD), true by id (MULTI, HSET of the body, ZADD
	// of the id, EXEC); Props gives every task with an id a small
	// properties JSON as well.
	IDs   []bool `json:"ids"`
	Props bool   `json:"props"`

	// CPUCap caps each instance (and the floor's publisher) at this
	// share of one core, a cgroup each with a CFS quota of CPUCap ×
	// CPUPeriod per CPUPeriod (0: no cap).
	CPUCap    float64  `json:"cpu_cap"`
	CPUPeriod Duration `json:"cpu_period"`

	// Floor: after each rate point (and each scale mode's highest rate),
	// the AMQP library's floor at the cadence the instances published.
	Floor bool `json:"floor"`

	// Scale mode: per instance count, the highest rate whose dispatch
	// lateness p99 (of the tasks due after the first second) stays at
	// most ScaleP99, by runs of ScaleStep each, at most ScaleSteps of
	// them, until the highest rate that held and the lowest that did not
	// are within ScalePrecision of each other.
	ScaleP99       Duration `json:"scale_p99"`
	ScaleStep      Duration `json:"scale_step"`
	ScaleSteps     int      `json:"scale_steps"`
	ScalePrecision float64  `json:"scale_precision"`

	// Compare is -compare's REF as given (a git ref, a release of
	// RELEASES or a dispatcher binary's path): every point is run for it
	// and for -dispatcher alternately, ComparePairs times each.
	Compare      string `json:"compare,omitempty"`
	ComparePairs int    `json:"compare_pairs,omitempty"`

	// IngressMax is the messages of ingress mode's max-ingest point,
	// published as fast as the broker confirms them (0: no such point);
	// IngressPrefetch each instance's DISPATCHER_QUEUE_<NAME>_INGRESS_PREFETCH.
	IngressMax      int  `json:"ingress_max,omitempty"`
	IngressPrefetch int  `json:"ingress_prefetch,omitempty"`
	IngressDrain    bool `json:"ingress_drain,omitempty"`

	Stall    Duration `json:"stall"`
	JSONPath string   `json:"-"`
	SVGPath  string   `json:"-"`
}

// Duration is a time.Duration written as Go syntax in JSON.
type Duration time.Duration

// MarshalText writes d as "1.5s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads what MarshalText wrote, so reports can be read back.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// Modes the bench knows.
const (
	modeBacklog = "backlog"
	modeRate    = "rate"
	modeIdle    = "idle"
	modeBurst   = "burst"
	modeMemory  = "memory"
	modeScale   = "scale"
	modeIngress = "ingress"
)

// Queue types of the consumer's queue.
const (
	queueClassic   = "classic"   // durable classic queue
	queueQuorum    = "quorum"    // quorum queue (always durable)
	queueTransient = "transient" // exclusive, non-durable, auto-delete
)

// Limits of the flags; the instance limits are the dispatcher's own.
const (
	minSize     = 16 // room for the task index the consumer reads back
	maxSize     = 16 << 20
	maxBacklog  = 100_000_000
	maxShards   = 4096
	maxBatch    = config.MaxBatchSize
	maxInstance = 64
	maxQueues   = 1000
	maxPrefetch = 65535 // AMQP's prefetch-count is 16 bits
)

var errHelp = errors.New("help requested")

// parseOptions reads the flags. Errors name the flag and its value.
func parseOptions(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{}
	fs := flag.NewFlagSet("dispatcher bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var modes, backlogs, rates, instances, shards, batches, sizes, queues string
	var duration, idle, stall, burstLead time.Duration
	fs.StringVar(&modes, "mode", "backlog,rate", "what to measure, comma-separated: backlog (throughput against the ceiling), rate (lateness at a steady rate), idle (Redis commands/s and CPU with nothing due), burst (-backlog tasks due at one time: the drain, and what a producer's ZADD and a stats read see meanwhile), memory (Redis bytes per pending task: -backlog tasks of each -size over -shards, no instance), ingress (messages published with x-delay to the ingress exchange of the instances' queue, as to the delayed-message plugin: ingest rate, publish-to-Redis latency, lateness; -rate for -duration, and -ingress-max messages as fast as the broker confirms them), scale (for each -instances count, the highest steady rate whose dispatch lateness p99 stays within -scale-p99: short rate runs, the rate doubled, halved, then bisected)")
	fs.StringVar(&backlogs, "backlog", "100000", "backlog mode: tasks pending when the dispatchers start; burst mode: tasks due at the one time (list; 1e6, 10^6, 1M and 1000000 all work)")
	fs.IntVar(&o.Window, "window", 200000, "backlog mode: how many of the pending tasks are due now; the rest are due in 1 hour")
	fs.BoolVar(&o.Drain, "drain", false, "backlog mode: make every pending task due now and drain them all")
	fs.StringVar(&rates, "rate", "2000", "rate mode: tasks per second, each scheduled 1s ahead of its due time (list); ingress mode: messages published per second (list); scale mode: the first rate tried")
	fs.DurationVar(&duration, "duration", 20*time.Second, "rate and ingress modes: how long tasks are scheduled (messages published)")
	var ahead time.Duration
	fs.DurationVar(&ahead, "ahead", time.Second, "rate mode: how long before its due time each task is ZADDed (the producer sends every 5ms what falls within this); ingress mode: every message's x-delay")
	var ingressMax string
	fs.StringVar(&ingressMax, "ingress-max", "100000", "ingress mode: after the -rate points, a max-ingest point: this many messages published as fast as the broker confirms them, with the largest -ceiling-window of unconfirmed ones (0: none)")
	fs.BoolVar(&o.IngressDrain, "ingress-drain", false, "ingress mode: after the max-ingest point, a drain point: the -ingress-max messages all published before the instances start, then ingested from the ingress queue's backlog (the ingress alone, without the publisher)")
	fs.IntVar(&o.IngressPrefetch, "ingress-prefetch", config.DefaultIngressPrefetch, "ingress mode: each instance's DISPATCHER_QUEUE_<NAME>_INGRESS_PREFETCH, the deliveries it holds unacked and writes to Redis in one round trip at most")
	fs.BoolVar(&o.Wake, "wake", false, "rate mode: after each ZADD, PUBLISH the wake-up the Go producer sends (P:{Q}:wake due:<i>:<due_ms>), for tasks scheduled at short notice")
	fs.DurationVar(&burstLead, "burst-lead", 0, "burst mode: the due time is this far ahead of the start of the load (default 10s plus 1s per 50,000 tasks)")
	fs.StringVar(&o.ProbeCPUs, "probe-cpus", "", "burst mode: run the probe process (a producer's ZADDs, the stats reads) on these CPUs, as taskset -c takes them (default: any)")
	fs.IntVar(&o.MaxRate, "max-rate", 0, "burst mode: the queue's DISPATCHER_QUEUE_<NAME>_MAX_RATE, tasks/s (0: no limit)")
	fs.DurationVar(&idle, "idle-duration", 10*time.Second, "idle mode: how long Redis commands are counted")
	fs.IntVar(&o.IdleTasks, "idle-pending", 0, "idle mode: tasks pending meanwhile, all due in 1 hour")
	fs.StringVar(&queues, "queues", "1", "idle and rate modes: queues each instance serves (bench, bench-2, ...), each with the point's shard count, all publishing to the point's one exchange with the queue name as routing key, all bound to the consumer's one queue; idle: all idle; rate: the -rate spread evenly over them, task j on queue j mod Q (list)")
	fs.StringVar(&instances, "instances", "1", "dispatcher processes (list)")
	fs.StringVar(&shards, "shards", "16", "shard count M (list)")
	fs.StringVar(&batches, "batch", "500", "DISPATCHER_BATCH_SIZE (list)")
	fs.StringVar(&sizes, "size", "200", "message (member) size in bytes (list)")
	fs.StringVar(&o.QueueType, "queue-type", queueClassic, "consumer queue: classic (durable), quorum, or transient (exclusive, non-durable)")
	fs.IntVar(&o.Prefetch, "prefetch", 1000, "consumer: QoS prefetch count, the most deliveries unacked at a time (0: no limit); each is acked right after it is recorded")
	fs.BoolVar(&o.AutoAck, "autoack", false, "consumer: consume with auto-ack instead of acking each delivery (no prefetch then)")
	ids := &idsFlag{list: []bool{false}}
	fs.Var(ids, "ids", "backlog, rate, burst and memory modes: schedule each task by id as the contract says (MULTI, HSET P:{Q:i}:tasks t<index> <body>, ZADD P:{Q:i} <due> t<index>, EXEC), the body the usual member of -size bytes; a list sweeps, e.g. -ids off,on (off: plain members)")
	fs.BoolVar(&o.Props, "props", false, "with -ids: each task also gets properties (HSET P:{Q:i}:props), a traceparent header of its own, 85 bytes of JSON")
	fs.BoolVar(&o.Cross, "cross", false, "run every combination of the lists; by default each list is swept on its own, the others held at their first value")
	fs.IntVar(&o.CeilingCount, "ceiling-count", 100000, "messages published raw to measure the ceiling")
	var ceilingWindows string
	fs.StringVar(&ceilingWindows, "ceiling-window", "300,1000,3000", "unconfirmed publishes the raw publisher keeps outstanding (list: each is measured, the fastest is the ceiling)")
	fs.BoolVar(&o.CeilingEach, "ceiling-each", false, "measure the ceiling before every backlog point (default: once per message size)")
	var cpuPeriod, scaleP99, scaleStep time.Duration
	fs.Float64Var(&o.CPUCap, "cpu-cap", 0, "cap each instance (and the floor's publisher) at this share of one core, e.g. 0.1, as a small machine would: a cgroup each (cgroup v1 cpu controller, or v2 with cpu enabled), made and removed by the bench; needs root (0: no cap)")
	fs.DurationVar(&cpuPeriod, "cpu-period", 10*time.Millisecond, "with -cpu-cap: the CFS period; the quota, period × cap, must be at least 1ms")
	fs.BoolVar(&o.Floor, "floor", false, "after each rate point (and each instance count's highest rate in scale mode), the floor: amqp091-go alone in a process of its own (capped alike) publishing at the cadence the instances did (their publish calls/s and tasks/s, same size, confirmed, persistent, mandatory) to the same kind of exchange and consumer; its CPU per 10,000 messages against the instances'")
	fs.DurationVar(&scaleP99, "scale-p99", 50*time.Millisecond, "scale mode: the dispatch lateness p99 a rate must keep (of the tasks due after the first second of each step)")
	fs.DurationVar(&scaleStep, "scale-step", 8*time.Second, "scale mode: how long each step schedules tasks (a rate run's -duration)")
	fs.IntVar(&o.ScaleSteps, "scale-steps", 8, "scale mode: the most steps per instance count")
	fs.Float64Var(&o.ScalePrecision, "scale-precision", 0.1, "scale mode: stop once the lowest rate that failed is within this fraction above the highest that held")
	fs.DurationVar(&stall, "stall", 45*time.Second, "give up on a point when no task arrives for this long")
	fs.StringVar(&o.JSONPath, "json", "", "write every figure to this JSON file (not if interrupted)")
	fs.StringVar(&o.SVGPath, "svg", "", "write the lateness distributions to this SVG file (not if interrupted)")
	// The defaults are resolved after parsing so that -h never shows a
	// password from the environment.
	fs.StringVar(&o.RedisURL, "redis", "", "Redis URL (default $DISPATCHER_REDIS_URL, else redis://localhost:6379/0)")
	fs.StringVar(&o.AMQPURL, "amqp", "", "RabbitMQ URL, or a cluster's node URLs comma-separated: the dispatchers get the list (DISPATCHER_AMQP_NODE_ORDER=listed), the consumer and the raw publisher use the first (default $DISPATCHER_AMQP_URL, else the guest user at localhost:5672)")
	fs.StringVar(&o.Dispatcher, "dispatcher", "", "dispatcher executable to start (default: this one)")
	fs.StringVar(&o.Compare, "compare", "", "compare against REF: a dispatcher binary's path, or a commit, branch or tag of the git repository here (or a version RELEASES lists), built from git archive with go build in a temporary directory; the points are run for REF and for -dispatcher alternately, -compare-pairs times each, and each figure is given per side (median, min-max) with the ratio -dispatcher/REF (backlog, rate, idle and ingress modes; for ingress, REF must have the AMQP ingress)")
	fs.IntVar(&o.ComparePairs, "compare-pairs", 3, "with -compare: how many times each side runs (REF first in every pair)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		printFlags(fs)
	}
	if err := fs.Parse(joinIDsList(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.IDs = ids.list
	o.Duration, o.Idle, o.Stall = Duration(duration), Duration(idle), Duration(stall)
	o.BurstLead = Duration(burstLead)
	o.Ahead = Duration(ahead)
	o.CPUPeriod, o.ScaleP99, o.ScaleStep = Duration(cpuPeriod), Duration(scaleP99), Duration(scaleStep)
	if ahead <= 0 || ahead > time.Minute {
		return nil, fmt.Errorf("-ahead %s: must be more than 0 and at most 1m", ahead)
	}
	if o.RedisURL == "" {
		o.RedisURL = envOr("DISPATCHER_REDIS_URL", "redis://localhost:6379/0")
	}
	if o.AMQPURL == "" {
		o.AMQPURL = envOr("DISPATCHER_AMQP_URL", "amqp://guest:guest@localhost:5672/")
	}

	var err error
	if o.AMQPURL == "" || config.SplitAMQPURLs(o.AMQPURL)[0] == "" {
		return nil, fmt.Errorf("-amqp %q: no URL", redact.URLs(o.AMQPURL))
	}
	o.Modes = splitList(modes)
	for _, m := range o.Modes {
		if m != modeBacklog && m != modeRate && m != modeIdle && m != modeBurst && m != modeMemory && m != modeScale && m != modeIngress {
			return nil, fmt.Errorf("-mode %q: want backlog, rate, idle, burst, memory, scale or ingress", modes)
		}
	}
	if len(o.Modes) == 0 {
		return nil, fmt.Errorf("-mode %q: empty", modes)
	}
	lists := []struct {
		name     string
		raw      string
		dst      *[]int
		min, max int
	}{
		{"backlog", backlogs, &o.Backlogs, 1, maxBacklog},
		{"rate", rates, &o.Rates, 1, 1_000_000},
		{"instances", instances, &o.Instances, 1, maxInstance},
		{"shards", shards, &o.Shards, 1, maxShards},
		{"batch", batches, &o.Batches, 1, maxBatch},
		{"size", sizes, &o.Sizes, minSize, maxSize},
		{"ceiling-window", ceilingWindows, &o.CeilingWindows, 1, 100000},
		{"queues", queues, &o.Queues, 1, maxQueues},
	}
	for _, l := range lists {
		if *l.dst, err = parseInts(l.raw, l.min, l.max); err != nil {
			return nil, fmt.Errorf("-%s %q: %w", l.name, l.raw, err)
		}
	}
	if o.IngressMax, err = parseCount(ingressMax); err != nil {
		return nil, fmt.Errorf("-ingress-max %q: %w", ingressMax, err)
	}
	switch {
	case o.Window < 1:
		return nil, fmt.Errorf("-window %d: must be at least 1", o.Window)
	case duration < time.Second:
		return nil, fmt.Errorf("-duration %s: must be at least 1s", duration)
	case idle < time.Second:
		return nil, fmt.Errorf("-idle-duration %s: must be at least 1s", idle)
	case o.IdleTasks < 0 || o.IdleTasks > maxBacklog:
		return nil, fmt.Errorf("-idle-pending %d: must be 0 to %d", o.IdleTasks, maxBacklog)
	case burstLead < 0:
		return nil, fmt.Errorf("-burst-lead %s: must not be negative", burstLead)
	case o.MaxRate < 0:
		return nil, fmt.Errorf("-max-rate %d: must be 0 (no limit) or more", o.MaxRate)
	case o.CeilingCount < 1:
		return nil, fmt.Errorf("-ceiling-count %d: must be at least 1", o.CeilingCount)
	case o.IngressMax < 0 || o.IngressMax > maxBacklog:
		return nil, fmt.Errorf("-ingress-max %d: must be 0 (no max-ingest point) to %d", o.IngressMax, maxBacklog)
	case o.IngressPrefetch < 1 || o.IngressPrefetch > maxPrefetch:
		return nil, fmt.Errorf("-ingress-prefetch %d: must be 1 to %d", o.IngressPrefetch, maxPrefetch)
	case stall < time.Second:
		return nil, fmt.Errorf("-stall %s: must be at least 1s", stall)
	case o.QueueType != queueClassic && o.QueueType != queueQuorum && o.QueueType != queueTransient:
		return nil, fmt.Errorf("-queue-type %q: want classic, quorum or transient", o.QueueType)
	case o.Prefetch < 0 || o.Prefetch > maxPrefetch:
		return nil, fmt.Errorf("-prefetch %d: must be 0 to %d", o.Prefetch, maxPrefetch)
	case math.IsNaN(o.CPUCap) || o.CPUCap < 0 || o.CPUCap > maxInstance:
		return nil, fmt.Errorf("-cpu-cap %g: must be 0 (no cap) or a share of one core up to %d", o.CPUCap, maxInstance)
	case cpuPeriod < time.Millisecond || cpuPeriod > time.Second:
		return nil, fmt.Errorf("-cpu-period %s: must be 1ms to 1s (the kernel's bounds)", cpuPeriod)
	case scaleP99 <= 0:
		return nil, fmt.Errorf("-scale-p99 %s: must be more than 0", scaleP99)
	case scaleStep < 2*time.Second:
		return nil, fmt.Errorf("-scale-step %s: must be at least 2s (the first second of each step is not judged)", scaleStep)
	case o.ScaleSteps < 1:
		return nil, fmt.Errorf("-scale-steps %d: must be at least 1", o.ScaleSteps)
	case math.IsNaN(o.ScalePrecision) || o.ScalePrecision <= 0 || o.ScalePrecision >= 1:
		return nil, fmt.Errorf("-scale-precision %g: must be more than 0 and less than 1", o.ScalePrecision)
	}
	if o.CPUCap > 0 {
		if _, err := quotaFor(o.CPUCap, cpuPeriod); err != nil {
			return nil, err
		}
	}
	if o.Props && !slices.Contains(o.IDs, true) {
		return nil, errors.New("-props: only tasks with an id carry properties here; add -ids")
	}
	if o.AutoAck {
		prefetchSet := false
		fs.Visit(func(f *flag.Flag) { prefetchSet = prefetchSet || f.Name == "prefetch" })
		if prefetchSet {
			return nil, fmt.Errorf("-prefetch %d with -autoack: an auto-ack consumer sets no prefetch", o.Prefetch)
		}
		o.Prefetch = 0
	}
	if o.Floor && !slices.Contains(o.Modes, modeRate) && !slices.Contains(o.Modes, modeScale) {
		return nil, fmt.Errorf("-floor with -mode %s: only rate and scale points measure the floor", modes)
	}
	if slices.Contains(o.Modes, modeScale) && o.Rates[0] < minScaleRate {
		return nil, fmt.Errorf("-rate %d: scale mode starts from the first rate, at least %d", o.Rates[0], minScaleRate)
	}
	if !slices.Contains(o.Modes, modeIngress) {
		// Reports of runs without ingress points stay as they were.
		o.IngressMax, o.IngressPrefetch = 0, 0
	}
	if o.IngressDrain && o.IngressMax == 0 {
		return nil, errors.New("-ingress-drain: the drain is of the -ingress-max messages; give -mode ingress and -ingress-max above 0")
	}
	if err := o.checkCompare(fs, modes); err != nil {
		return nil, err
	}
	for _, r := range o.Rates {
		if int64(r)*int64(duration/time.Second) > maxBacklog {
			return nil, fmt.Errorf("-rate %d for -duration %s: more than %d tasks", r, duration, maxBacklog)
		}
	}
	return o, nil
}

const usageHead = `Usage: dispatcher bench [flags]

Measures this dispatcher against the raw broker on the given Redis and
RabbitMQ. It starts the dispatchers as child processes (DISPATCHER_* from
the environment, e.g. DISPATCHER_PIPELINE, are passed on; the bench sets
DISPATCHER_STAMP_PUBLISHED=true itself when the dispatcher knows it) on a
key prefix, queue and exchange of its own, schedules tasks with plain ZADDs
as any producer may (-ids: by id, MULTI, HSET, ZADD, EXEC), and consumes
them with a plain AMQP consumer from a queue bound to the exchange. The
consumer acks like a worker: each delivery is acked on its own right after
its receipt time is taken and it is recorded, with a QoS prefetch of
-prefetch; -autoack consumes with auto-ack instead. Every table says which.
Every key, queue and exchange it made is removed at the end, on Ctrl-C too.

Modes:
  backlog  N tasks pending (-backlog), W of them due (-window; -drain: all),
           when K instances (-instances) start. Before the first point of
           each message size and form, the ceiling: -ceiling-count raw
           confirmed publishes (persistent, mandatory, one channel,
           -ceiling-window unconfirmed at most) of that size to a queue of
           the same type, with the x-task-id header of -ids and the
           traceparent of -props as the dispatcher's messages carry them,
           consumed meanwhile by the same consumer; the fastest window
           counts.
  rate     -rate tasks/s for -duration, each ZADDed 1s before it is due.
           Besides the whole run, a row for the start of traffic: the
           tasks due in the first second from the earliest task's due time.
           With -queues Q, the instances serve Q queues (as in idle mode)
           and the rate is spread evenly over them (-rate 2000 -queues 100:
           20 tasks/s each; task j goes to queue j mod Q); one consumer
           queue gets them all, and every figure covers all Q queues.
  idle     K ready instances serving -queues queues (bench, bench-2, ...,
           each with the point's shards), nothing due, for -idle-duration.
  scale    for each -instances count, the highest steady rate whose
           dispatch lateness p99 stays within -scale-p99: rate runs of
           -scale-step each (the first second of traffic not judged),
           starting at the first -rate (then at 1.5 times the previous
           count's best), the rate doubled until one fails, halved until
           one holds, then bisected to -scale-precision, -scale-steps at
           most. A step whose instances have not dispatched 99% of its
           tasks by -scale-p99 plus 1s after the last due time is cut
           short as overloaded. For each count: the rate, its lateness,
           each instance's share of the tasks and its CPU.
  ingress  producers that speak only AMQP: the instances serve a queue with
           an ingress exchange (DISPATCHER_QUEUE_<NAME>_INGRESS_EXCHANGE,
           its queue of -queue-type, classic for transient, prefetch
           -ingress-prefetch); a publisher on its own connection publishes
           to it as to the delayed-message plugin: confirmed, persistent,
           mandatory, message_id t<index>, header x-delay = -ahead in ms.
           One point per -rate, paced over -duration, then (-ingress-max
           N) N messages as fast as the broker confirms them, with the
           largest -ceiling-window unconfirmed at most; -ingress-drain
           adds a point whose N are all published before the instances
           start: the ingress alone drains the backlog. The ceiling, of
           plain messages, is measured first, as in backlog mode. The
           consumer checks every
           task once, its message_id, x-task-id and x-delay.
With -cpu-cap C each instance runs in a cgroup of its own capped at C of
one core (a CFS quota of C x -cpu-period every -cpu-period, read back from
the kernel), removed at the end; the tables give the cap and how often
the kernel held each instance (throttled periods). With -floor, after
each rate point (and each count's best rate), amqp091-go alone, in a
process of its own (capped alike), publishes at the cadence the instances
did: their publish calls/s (dispatcher_broker_publish_batches_total) and
tasks/s, the same size, confirmed, persistent, mandatory, up to
DISPATCHER_PIPELINE calls outstanding, to the point's exchange, consumed
by the same consumer. Its CPU (utime+stime from its first publish to its
last confirm) per 10,000 messages is the floor; the instances' CPU per
10,000 tasks is given as a multiple of it.
Each list flag is swept on its own around the first values (-cross: every
combination).
With -compare REF (backlog, rate, idle and ingress modes; ingress needs
a REF that has the AMQP ingress), every point is run for REF and for
-dispatcher (default: this binary) in turn, REF first, as many pairs as
-compare-pairs; REF is a dispatcher binary's path, or a
commit, branch or tag of the git repository around the working directory
(or a version its RELEASES lists), built with git archive and the go on
PATH in a temporary directory removed at the end. The table gives each
side's median (least-most) of the figures that weigh a change and the
ratio current/REF of the medians (least-most of the per-pair ratios);
-json holds every run's report as well.

Figures:
  tasks/s          tasks received, first to last receipt; the ceiling alike
  dispatch         lateness the dispatcher adds: header x-published-us (when
                   its batch's publish began, Redis clock) minus due time,
                   ms; "-" when the dispatcher does not stamp it (an older
                   binary given with -dispatcher)
  consumer         lateness a consumer sees: receipt minus due time
                   (x-due-ms), ms; also per shard (message_id hash mod M;
                   with -queues, shard i of every queue together)
  Redis cmds/task  INFO commandstats calls over the run (server-wide!) per
                   task, commands run inside Lua scripts included (Redis
                   counts them: it is the server's work); the bench's own
                   INFO/CLIENT LIST and, in rate mode, its writes (ZADD;
                   with -ids MULTI, HSET, EXEC too) left out.
                   scripts/task: the EVALSHA calls among them.
  Redis CPU        used_cpu_sys + used_cpu_user of INFO cpu over the same
                   window, summed over every primary: seconds per 10,000
                   tasks, or % of one core (idle). It is everything the
                   server did meanwhile: other clients, the bench's own
                   INFO calls and, in rate mode, its ZADDs included.
  CPU s/10k tasks  utime+stime of all instances (/proc), per 10,000 tasks
                   (the JSON has each instance's too); backlog: whole life,
                   rate and idle: from ready on
  peak RSS         the largest VmHWM of the instances
Ingress figures:
  ingest/s         tasks written to Redis per second: first to last
                   ingest, each task's ingest time being the Redis clock
                   reading its instance took before the batch's write
                   (x-due-ms minus x-delay at the consumer); of the
                   ceiling: against the ceiling's received/s
  publish/s        the publisher's confirms per second, first publish to
                   last confirm
  to Redis         publish to the task seen in Redis: one message in k
                   (k = rate/500, at least 1; paced points only) is
                   looked for with ZSCORE on its pending set every 1 ms
                   from its publish; the time of the first poll that
                   finds it, so late by up to about 1 ms; the ZSCOREs are
                   left out of the Redis counts (not of Redis CPU)
  to ingest        publish to the ingress's clock reading before the
                   batch's write, every message (the ingest time above
                   minus the publish time, Redis clock; truncated to the
                   ms): short of "to Redis" by the write's round trip
  dispatch, consumer, Redis cmds/task, CPU: as above, per task ingested
                   and dispatched (ingest and dispatch together)
Redis figures include other clients' commands: a note says when any were
active. -redis may be any DISPATCHER_REDIS_URL (redis://, redis+cluster://,
redis+sentinel://, with s for TLS); on a cluster, the Redis figures are
summed over every primary and also given per primary (replicas' REPLCONF
left out). Exit code 0 if every task arrived exactly once and none early, 1
otherwise or when something failed, 2 for bad flags.

Flags:
`

// consumerText says how the bench's consumer consumed, for the report.
func (o *Options) consumerText() string {
	if o.AutoAck {
		return "auto-ack (no prefetch)"
	}
	return "manual ack of each delivery right after it is recorded, prefetch " + o.prefetchText()
}

// consumerShort is consumerText for a table's caption.
func (o *Options) consumerShort() string {
	if o.AutoAck {
		return "auto-ack"
	}
	return "ack each, prefetch " + o.prefetchText()
}

func (o *Options) prefetchText() string {
	if o.Prefetch == 0 {
		return "unlimited"
	}
	return thousands(o.Prefetch)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseInts parses a comma-separated list of counts, each within [lo, hi].
func parseInts(s string, lo, hi int) ([]int, error) {
	fields := splitList(s)
	if len(fields) == 0 {
		return nil, errors.New("empty list")
	}
	out := make([]int, 0, len(fields))
	for _, f := range fields {
		n, err := parseCount(f)
		if err != nil {
			return nil, err
		}
		if n < lo || n > hi {
			return nil, fmt.Errorf("%s: must be %d to %d", f, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseCount reads 1000, 1e3, 10^3, 1k or 1M.
func parseCount(f string) (int, error) {
	orig := f
	if n, err := strconv.Atoi(f); err == nil {
		return n, nil
	}
	if base, exp, ok := strings.Cut(f, "^"); ok {
		b, err1 := strconv.Atoi(base)
		e, err2 := strconv.Atoi(exp)
		if err1 != nil || err2 != nil || e < 0 || e > 18 {
			return 0, fmt.Errorf("%s: not a count", f)
		}
		v := math.Pow(float64(b), float64(e))
		if v > math.MaxInt32*4 {
			return 0, fmt.Errorf("%s: too large", f)
		}
		return int(v), nil
	}
	mult := 1.0
	switch {
	case strings.HasSuffix(f, "k"), strings.HasSuffix(f, "K"):
		mult, f = 1e3, f[:len(f)-1]
	case strings.HasSuffix(f, "M"):
		mult, f = 1e6, f[:len(f)-1]
	}
	v, err := strconv.ParseFloat(f, 64)
	if err != nil || v < 0 || v*mult > math.MaxInt32*4 || v*mult != math.Trunc(v*mult) {
		return 0, fmt.Errorf("%s: not a count", orig)
	}
	return int(v * mult), nil
}

// firstAMQP is the node the consumer and the raw publisher use: the first
// of the list, the one the dispatchers prefer.
func (o *Options) firstAMQP() string { return config.SplitAMQPURLs(o.AMQPURL)[0] }

// printFlags is flag.PrintDefaults with each usage wrapped to fit an
// 80-column terminal.
func printFlags(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintln(fs.Output(), line)
		if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" {
			if name == "string" {
				def = strconv.Quote(def)
			}
			usage += " (default " + def + ")"
		}
		var b strings.Builder
		for _, word := range strings.Fields(usage) {
			if b.Len() > 0 && b.Len()+1+len(word) > 74 {
				fmt.Fprintf(fs.Output(), "      %s\n", b.String())
				b.Reset()
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(word)
		}
		if b.Len() > 0 {
			fmt.Fprintf(fs.Output(), "      %s\n", b.String())
		}
	})
}

// idsFlag is -ids: a boolean flag (-ids alone means on) that also takes a
// list to sweep, -ids=off,on (see joinIDsList for -ids off,on).
type idsFlag struct{ list []bool }

func (f *idsFlag) IsBoolFlag() bool { return true }

func (f *idsFlag) String() string {
	if f == nil || len(f.list) == 0 {
		return ""
	}
	var parts []string
	for _, v := range f.list {
		parts = append(parts, map[bool]string{false: "off", true: "on"}[v])
	}
	return strings.Join(parts, ",")
}

func (f *idsFlag) Set(s string) error {
	list, err := parseIDsList(s)
	if err != nil {
		return err
	}
	f.list = list
	return nil
}

// parseIDsList reads "on", "off,on", "true", ...; repeats are dropped.
func parseIDsList(s string) ([]bool, error) {
	var out []bool
	for _, f := range splitList(s) {
		var v bool
		switch strings.ToLower(f) {
		case "on", "true", "1", "yes":
			v = true
		case "off", "false", "0", "no":
		default:
			return nil, fmt.Errorf("%q: want on or off (a list: off,on)", f)
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// joinIDsList lets -ids take its list as the next argument (-ids off,on),
// as the other lists do; a boolean flag would otherwise leave it as a
// stray argument. The bench takes no other arguments, so a next one that
// reads as an on/off list can only be meant for -ids.
func joinIDsList(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "-ids" || a == "--ids") && i+1 < len(args) {
			if _, err := parseIDsList(args[i+1]); err == nil {
				out = append(out, a+"="+args[i+1])
				i++
				continue
			}
		}
		out = append(out, a)
	}
	return out
}
