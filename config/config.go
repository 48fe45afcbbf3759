// Package config loads the dispatcher's settings from the environment and
// validates them before anything connects.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kelseyhightower/envconfig"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/internal/tlsfiles"
	"github.com/dispatcher/dispatcher/shard"
)

// Prefix starts every variable the dispatcher reads.
const Prefix = "DISPATCHER"

// MaxBatchSize bounds a claim: it is one script call, during which Redis
// serves no other client, and 1,000 tasks of 200 bytes take some 2.5 ms.
// A larger DISPATCHER_BATCH_SIZE (valid up to 10,000) is taken as this.
const MaxBatchSize = 1000

// Settings are the instance-wide settings. The desc tags feed --help.
// required:"daemon" (DISPATCHER_QUEUES): envconfig leaves it alone, as the
// commands run without it (LoadTool); Load requires it and --help shows it
// required.
type Settings struct {
	RedisURL         string        `envconfig:"DISPATCHER_REDIS_URL" default:"redis://localhost:6379/0" desc:"Redis URL; the scheme picks the mode: redis:// or rediss:// (one server), redis+cluster:// (Redis Cluster: seed nodes as host and addr=), redis+sentinel:// (Sentinel: sentinels as host and addr=, master_name= required), each also as rediss+...; user and password for ACLs, the password never logged; go-redis query options apply, and the dispatcher defaults to read_timeout=3s, write_timeout=3s, max_retries=1 so that a dead connection is noticed in seconds" see:"docs/redis-cluster.md"`
	AMQPURL          string        `envconfig:"DISPATCHER_AMQP_URL" default:"amqp://guest:guest@localhost:5672/" desc:"RabbitMQ URL (amqp:// or amqps://), or the comma-separated URLs of one cluster's nodes (schemes may be mixed): the dispatcher connects to one and, when it is lost or refuses, goes on to the next; ?heartbeat=N sets the heartbeat (default 10s; a silent connection counts as dead after 1.5 × N); the password is never logged" see:"docs/rabbitmq-cluster.md"`
	AMQPNodeOrder    string        `envconfig:"DISPATCHER_AMQP_NODE_ORDER" default:"shuffle" desc:"order in which the nodes of DISPATCHER_AMQP_URL are tried: shuffle (each instance its own random order, so instances spread over the nodes) or listed (the first node is preferred, the others are fallbacks)"`
	RedisCAFile      string        `envconfig:"DISPATCHER_REDIS_CA_FILE" default:"" desc:"PEM file of the CA(s) to trust for rediss:// (default: the system's)"`
	RedisCertFile    string        `envconfig:"DISPATCHER_REDIS_CERT_FILE" default:"" desc:"PEM client certificate for rediss://, with DISPATCHER_REDIS_KEY_FILE"`
	RedisKeyFile     string        `envconfig:"DISPATCHER_REDIS_KEY_FILE" default:"" desc:"PEM private key of DISPATCHER_REDIS_CERT_FILE"`
	AMQPCAFile       string        `envconfig:"DISPATCHER_AMQP_CA_FILE" default:"" desc:"PEM file of the CA(s) to trust for amqps:// (default: the system's)"`
	AMQPCertFile     string        `envconfig:"DISPATCHER_AMQP_CERT_FILE" default:"" desc:"PEM client certificate for amqps://, with DISPATCHER_AMQP_KEY_FILE"`
	AMQPKeyFile      string        `envconfig:"DISPATCHER_AMQP_KEY_FILE" default:"" desc:"PEM private key of DISPATCHER_AMQP_CERT_FILE"`
	KeyPrefix        string        `envconfig:"DISPATCHER_KEY_PREFIX" default:"dq" desc:"prefix P of every Redis key (shard i of queue Q is P:{Q:i}): 1 to 64 characters without {, } or whitespace"`
	Queues           []string      `envconfig:"DISPATCHER_QUEUES" required:"daemon" desc:"comma-separated queue names this instance serves, each 1 to 64 ASCII letters, digits, underscores, dots or hyphens (two names may not map to the same <NAME>)"`
	Lease            time.Duration `envconfig:"DISPATCHER_LEASE" default:"30s" desc:"how long a claimed task may stay unconfirmed before any instance hands it out again (at least 1s); give every instance of a queue the same value: a shard's lease deadlines never go back, so a shorter lease claimed after a longer one gets the longer one's deadline" see:"docs/how-it-works.md#process-death"`
	HTTPAddr         string        `envconfig:"DISPATCHER_HTTP_ADDR" default:"" desc:"address of the status page (/) and of /healthz, /readyz and /metrics, e.g. 127.0.0.1:9090; a port alone (:9090) binds 127.0.0.1 only, give a host (0.0.0.0:9090, [::]:9090) to serve other interfaces; empty turns it off" see:"docs/monitoring.md#http-endpoint"`
	HTTPAuthToken    string        `envconfig:"DISPATCHER_HTTP_AUTH_TOKEN" default:"" desc:"a secret (16 to 4096 printable characters): when set, the status page (/) and /metrics answer only requests with the header Authorization: Bearer <token> (or basic auth with the token as the password) and 401 otherwise; /healthz and /readyz stay open for probes; never logged; empty: no check" see:"docs/monitoring.md#http-endpoint"`
	BatchSize        int           `envconfig:"DISPATCHER_BATCH_SIZE" default:"500" desc:"most tasks taken from one shard in one claim; a claim also stops at 1 MiB of bodies; 1 to 10000 is accepted, and more than 1000 is taken as 1000 with a warning (a claim holds Redis for its whole run)" see:"docs/performance.md#a-million-due-in-the-same-second"`
	Pipeline         int           `envconfig:"DISPATCHER_PIPELINE" default:"4" desc:"claimed batches per queue being published at once (1 to 64)"`
	PollInterval     time.Duration `envconfig:"DISPATCHER_POLL_INTERVAL" default:"50ms" desc:"how often the queue's sweeping instance looks at every shard for newly scheduled tasks while the queue is in use (any positive duration); known due times are waited for exactly" see:"docs/how-it-works.md#scan-loop"`
	IdlePollInterval time.Duration `envconfig:"DISPATCHER_IDLE_POLL_INTERVAL" default:"500ms" desc:"how far the sweeps of a quiet queue stretch out: each sweep that finds nothing new doubles the interval from DISPATCHER_POLL_INTERVAL up to this, and a sweep that finds a task due sooner than this, or a wake-up, brings it back; a task due at least this long after its ZADD is found before it is due, one ZADDed due at once without a wake-up waits up to this long on a quiet queue (any positive duration; taken as at least DISPATCHER_POLL_INTERVAL; above 1s, the Go producer's wake-up window, a warning)" see:"CONTRACT.md#waking-the-dispatchers-extension"`
	Lookahead        time.Duration `envconfig:"DISPATCHER_LOOKAHEAD" default:"100ms" desc:"how far ahead of their due time tasks may be claimed (0 to 10s): the instance holds them and publishes each at its due time by the Redis clock, never before, so steady traffic is claimed in batches; a task this close to its due time can no longer be cancelled; 0 claims only due tasks" see:"docs/how-it-works.md#holding-and-publishing-on-the-dot"`
	PublishTick      time.Duration `envconfig:"DISPATCHER_PUBLISH_TICK" default:"0s" desc:"held tasks go out at the first multiple of this (Redis clock) at or after their due time, those of one tick in one publish (0 to 1s): less dispatcher CPU under steady traffic for up to this much lateness (at 2,000 tasks a second, 5ms cut it by a third); 0 publishes each at its due time" see:"docs/performance.md#steady-traffic-claiming-ahead"`
	ClockReadGap     time.Duration `envconfig:"DISPATCHER_CLOCK_READ_GAP" default:"5ms" desc:"held tasks go out only once a reading of the Redis clock taken after they were held shows them due; an instance reads a primary's clock at most once per this (0 to 1s), and tasks falling due in between wait for the next reading: under steady traffic of thousands a second, 5ms halves the readings (a Redis command and a round trip each) for up to 5ms of lateness; 0 reads at each instant tasks fall due" see:"docs/performance.md#steady-traffic-claiming-ahead"`
	LivenessTimeout  time.Duration `envconfig:"DISPATCHER_LIVENESS_TIMEOUT" defaultText:"1.5s, at most LEASE/2" desc:"an instance whose heartbeat is this old and whose Redis connection is gone (a killed process, a lost machine whose connection Redis closed) is declared dead, and what it had claimed is handed out again at once instead of when its lease runs out; an instance that is stopped or cut off but still connected is left to its leases, so it never causes a duplicate; heartbeats go every quarter of it, and an instance publishes only while its last one is under half of it old; 0 turns this off (leases only); 400ms to DISPATCHER_LEASE/2" see:"docs/how-it-works.md#liveness-a-dead-instances-claims-in-seconds"`
	ConfirmTimeout   time.Duration `envconfig:"DISPATCHER_CONFIRM_TIMEOUT" defaultText:"LEASE/3, at most 10s" desc:"how long to wait for the broker to confirm a publish, counted from when it was written or from the broker's latest answer on the channel, whichever is later (a slow link still carrying earlier messages is not a dead broker), before the publish counts as failed and is retried; also the longest a socket write to the broker may make no progress before the connection is dropped; positive and shorter than DISPATCHER_LEASE"`
	ShutdownTimeout  time.Duration `envconfig:"DISPATCHER_SHUTDOWN_TIMEOUT" default:"10s" desc:"on SIGTERM or SIGINT, how long to wait for outstanding confirms before handing the rest back to the other instances (any positive duration)" see:"docs/how-it-works.md#shutdown"`
	MaxMessageBytes  int           `envconfig:"DISPATCHER_MAX_MESSAGE_BYTES" default:"16777216" desc:"members larger than this go straight to the shard's dead-letter set (1 to 536870912, i.e. 512 MiB)"`
	MaxAttempts      int           `envconfig:"DISPATCHER_MAX_ATTEMPTS" default:"5" desc:"publishes the broker refuses (e.g. over its max_message_size) before a task goes to the dead-letter set (1 to 1000)"`
	RetryMin         time.Duration `envconfig:"DISPATCHER_RETRY_MIN" default:"1s" desc:"first backoff before a failed publish (nack, unroutable, timeout) is retried; doubles per attempt (any positive duration)"`
	RetryMax         time.Duration `envconfig:"DISPATCHER_RETRY_MAX" default:"1m" desc:"longest backoff between retries of one task; not shorter than DISPATCHER_RETRY_MIN"`
	StampPublished   bool          `envconfig:"DISPATCHER_STAMP_PUBLISHED" default:"false" desc:"add header x-published-us to every message: when its batch's publish began, in µs on the Redis clock, so consumers can tell the dispatcher's lateness from the broker's and their own (dispatcher bench turns it on)"`
	StatsInterval    time.Duration `envconfig:"DISPATCHER_STATS_INTERVAL" default:"1s" desc:"how often the instance that sweeps a queue reads its state (pending, due, in flight, retried, dead, oldest due age) for the dispatcher_queue_* metrics, the status page and the stall watchdog, at least 1s: one small script call per queue (per shard on Redis Cluster); a quiet queue is read less, down to every 8 intervals, and a dozing one (empty, looked at by the idle watch) every 30" see:"docs/monitoring.md#queue-state-metrics"`
	StallAfter       time.Duration `envconfig:"DISPATCHER_STALL_AFTER" default:"30s" desc:"a queue whose oldest due task (pending, or retried after a failed publish) has waited longer than this counts as stalled: the sweeping instance logs it at error level with what it waits on, /readyz reports it and dispatcher_queue_stalled is 1 (any positive duration)" see:"docs/monitoring.md#stall-watchdog"`
	LogLevel         string        `envconfig:"DISPATCHER_LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat        string        `envconfig:"DISPATCHER_LOG_FORMAT" default:"text" desc:"text or json (log/slog, to stderr)"`
	RecurringFile    string        `envconfig:"DISPATCHER_RECURRING_FILE" default:"" desc:"JSON file of recurring schedules for the queues this instance serves, kept in version control: applied to Redis at start and whenever its content changes (read every 2s); schedules it added and no longer lists are removed, those added from the CLI are left alone; an invalid schedule is logged with its name and left out; empty: none" see:"docs/recurring.md#the-schedule-file"`

	// QueueSettings holds one entry per name in Queues, in that order.
	QueueSettings []Queue `ignored:"true"`
	// Extra holds the queues a command named that are not in Queues
	// (LoadTool only).
	Extra []Queue `ignored:"true"`
}

// Queue returns the settings of the queue named, from QueueSettings or
// Extra.
func (s *Settings) Queue(name string) (Queue, bool) {
	for _, q := range append(s.QueueSettings[:len(s.QueueSettings):len(s.QueueSettings)], s.Extra...) {
		if q.Name == name {
			return q, true
		}
	}
	return Queue{}, false
}

// Queue are the settings of one queue, read from DISPATCHER_QUEUE_<NAME>_*.
// They are read by hand rather than with envconfig, whose fallback to the
// unprefixed name would pick up any SHARDS or EXCHANGE in the environment.
type Queue struct {
	Name       string
	Shards     int     `env:"SHARDS" required:"true" desc:"shard count M a new queue starts with (1 to 4096); once a count is recorded in Redis (P:{Q}:shards) that one is served, and a different value here gets a warning at start (dispatcher reshard changes the count)" see:"docs/resharding.md#the-configured-count"`
	Exchange   string  `env:"EXCHANGE" required:"true" desc:"exchange the queue's tasks are published to (at most 255 bytes); declared durable direct if missing, used as it is otherwise; set but empty means the default exchange"`
	RoutingKey string  `env:"ROUTING_KEY" default:"" defaultText:"the queue name" desc:"routing key of the published messages (at most 255 bytes); empty or unset means the queue name"`
	MaxRate    float64 `env:"MAX_RATE" default:"0" defaultText:"0 (no limit)" desc:"most tasks a second the queue's instances dispatch together (a token bucket in Redis holding a tenth of a second's worth), so that a backlog after an outage drains at a pace the consumers survive, oldest first in each shard; with a limit, claims take due tasks only (no look-ahead), and instances that cannot reach the bucket claim nothing meanwhile; 0 means no limit, else at least 0.001" see:"docs/steering.md#steering-schedule-cancel-list-dead-letters-pause-rate-limit"`
	DrainRate  float64 `env:"DRAIN_RATE" default:"1000" desc:"tasks a second the queue's consumers are taken to handle, for the thundering-herd warning only (at least 0.001): more tasks due in one second of the next minute than the queue drains in 10 s at the lower of this and MAX_RATE are warned of ahead (log, status page, dispatcher_queue_herd_ahead); changes nothing in how tasks are dispatched" see:"docs/monitoring.md#forecast-and-thundering-herds"`
	// Unroutable is what a task the broker returns as unroutable gets:
	// UnroutableRetry ("" too: unset), UnroutableDeadLetter (after
	// UnroutableAttempts returns; 0: DISPATCHER_MAX_ATTEMPTS) or
	// UnroutableDrop.
	Unroutable         string `env:"UNROUTABLE" default:"retry" desc:"what a task the broker returns as unroutable (no queue bound for its routing key) gets: retry (retried with backoff, without limit for the queue's own routing key, dead-lettered after DISPATCHER_MAX_ATTEMPTS returns for a task's own routing_key), dead-letter (dead-lettered after DISPATCHER_MAX_ATTEMPTS returns, whatever its routing key), dead-letter:N (after N returns, 1 to 1000), or drop (forgotten at its first return, as the delayed-message plugin dropped it, with a log line per task and dispatcher_tasks_unroutable_dropped_total counting them)" see:"docs/failure-modes.md#no-consumer-queue-bound-unroutable"`
	UnroutableAttempts int
	// The AMQP ingress (docs/migrating-from-delayed-plugin.md).
	IngressExchange  string        `env:"INGRESS_EXCHANGE" default:"" defaultText:"none (ingress off)" desc:"exchange producers publish to with x-delay, as to the delayed-message plugin (at most 255 bytes); set, every instance serving the queue declares it (durable topic) if missing, and a durable queue dispatcher.ingress.<name> bound to it with #, and writes each message into the queue's shards as a task with an id; an exchange of another type stops the start" see:"docs/migrating-from-delayed-plugin.md"`
	IngressPrefetch  int           `env:"INGRESS_PREFETCH" default:"256" desc:"ingress deliveries held unacked by one instance, 1 to 65535: the most written to Redis in one pipelined round trip before their ack" see:"docs/migrating-from-delayed-plugin.md"`
	IngressQueueType string        `env:"INGRESS_QUEUE_TYPE" default:"quorum" desc:"type of the ingress queue dispatcher.ingress.<name>: quorum (replicated; RabbitMQ 3.8 and later) or classic" see:"docs/migrating-from-delayed-plugin.md"`
	IngressMaxDelay  time.Duration `env:"INGRESS_MAX_DELAY" default:"87600h" desc:"longest delay an ingress message may ask for (x-delay, or x-due-ms from its base time), at least 1s; beyond it the message becomes a dead letter of the queue (dispatcher dead list) with the reason logged" see:"docs/migrating-from-delayed-plugin.md"`
}

// Values of a queue's UNROUTABLE.
const (
	UnroutableRetry      = "retry"
	UnroutableDeadLetter = "dead-letter"
	UnroutableDrop       = "drop"
)

// Ingress defaults.
const (
	DefaultIngressPrefetch = 256
	DefaultIngressMaxDelay = 87600 * time.Hour
)

// DefaultDrainRate is DRAIN_RATE when it is not set (DrainRate 0).
const DefaultDrainRate = 1000

// HerdDrain is the rate the queue is taken to drain at, for the herd
// warning: the lower of MAX_RATE (the dispatcher goes no faster) and
// DRAIN_RATE (the consumers, as the operator says), with what it comes
// from.
func (q Queue) HerdDrain() (rate float64, from string) {
	rate, from = q.DrainRate, "DRAIN_RATE"
	if rate <= 0 {
		rate, from = DefaultDrainRate, "default DRAIN_RATE"
	}
	if q.MaxRate > 0 && q.MaxRate < rate {
		rate, from = q.MaxRate, "MAX_RATE"
	}
	return rate, from
}

// EnvName is the <NAME> part of a queue's variables: the queue name
// upper-cased, every character outside A-Z 0-9 written as _.
func EnvName(queue string) string {
	b := []byte(strings.ToUpper(queue))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// QueuePrefix is the variable prefix of one queue, without the trailing _.
func QueuePrefix(queue string) string { return Prefix + "_QUEUE_" + EnvName(queue) }

// Error is a settings error: it names the variable and its value.
type Error struct {
	Var    string
	Value  string
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s=%q: %s", e.Var, redact.URL(e.Value), oneLine(redact.String(e.Reason)))
}

// oneLine escapes control characters, which a reason quoting outside
// input (a URL path, say) could otherwise carry into the log.
func oneLine(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) {
			b.WriteString(strconv.QuoteRune(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// urlReason is why a URL setting is bad, unless saying so would show its
// password: parsers quote the pieces they choke on.
func urlReason(raw string, err error) string {
	for _, pw := range redact.Passwords(raw) {
		if redact.Leaks(err.Error(), pw) {
			return "not a valid URL (details withheld as they would show the password; percent-encode reserved characters in it)"
		}
	}
	return redact.String(err.Error())
}

// DefaultLivenessTimeout is the liveness timeout when none is given (at
// most half the lease).
const DefaultLivenessTimeout = 1500 * time.Millisecond

// DefaultConfirmTimeout is the confirm timeout when none is given: a third
// of the lease, so a publish that timed out is settled well before its
// lease runs out, and at most 10s.
func DefaultConfirmTimeout(lease time.Duration) time.Duration {
	return min(10*time.Second, lease/3)
}

// Load reads and validates the daemon's settings from the process
// environment. It does not touch the network.
func Load() (*Settings, error) { return load(nil, false) }

// LoadTool reads and validates the settings of a command (schedule,
// stats, ...) from the process environment: as Load, but DISPATCHER_QUEUES
// and each queue's SHARDS and EXCHANGE may be left out (a command reads
// the shard count recorded in Redis, and publishes nothing). The queues
// named are loaded too, so their DISPATCHER_QUEUE_<NAME>_* variables count
// as known; when DISPATCHER_QUEUES is set, the caller checks that they are
// among them. A queue's Shards is 0 where not set.
func LoadTool(named ...string) (*Settings, error) { return load(named, true) }

func load(named []string, tool bool) (*Settings, error) {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, Prefix+"_") {
			env[k] = v
		}
	}
	if _, ok := env[Prefix+"_QUEUES"]; !ok && !tool {
		return nil, &Error{Var: Prefix + "_QUEUES", Reason: "required, not set"}
	}
	var s Settings
	// Full variable names are in the tags and the prefix is empty, so
	// envconfig never falls back to unprefixed names like REDIS_URL.
	if err := envconfig.Process("", &s); err != nil {
		return nil, translate(err, env)
	}
	if env[Prefix+"_CONFIRM_TIMEOUT"] == "" {
		s.ConfirmTimeout = DefaultConfirmTimeout(s.Lease)
	}
	if env[Prefix+"_LIVENESS_TIMEOUT"] == "" {
		s.LivenessTimeout = min(DefaultLivenessTimeout, s.Lease/2)
	}
	seen := map[string]string{}
	for i, name := range s.Queues {
		name = strings.TrimSpace(name)
		s.Queues[i] = name
		if !shard.ValidQueueName(name) {
			return nil, &Error{Var: Prefix + "_QUEUES", Value: env[Prefix+"_QUEUES"],
				Reason: fmt.Sprintf("queue name %q: want 1 to 64 characters of A-Z a-z 0-9 _ . -", name)}
		}
		if other, dup := seen[EnvName(name)]; dup {
			return nil, &Error{Var: Prefix + "_QUEUES", Value: env[Prefix+"_QUEUES"],
				Reason: fmt.Sprintf("queues %q and %q share the variables %s_*", other, name, QueuePrefix(name))}
		}
		seen[EnvName(name)] = name
	}
	for _, name := range s.Queues {
		q, err := loadQueue(name, env, tool)
		if err != nil {
			return nil, err
		}
		s.QueueSettings = append(s.QueueSettings, q)
	}
	for _, name := range named {
		if seen[EnvName(name)] != "" || !shard.ValidQueueName(name) {
			continue // loaded already, or refused by the command
		}
		seen[EnvName(name)] = name
		q, err := loadQueue(name, env, tool)
		if err != nil {
			return nil, err
		}
		s.Extra = append(s.Extra, q)
	}
	if err := s.validate(tool); err != nil {
		return nil, err
	}
	if err := checkUnknown(env, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// loadQueue reads one queue's variables; with tool, SHARDS (then 0) and
// EXCHANGE may be missing.
func loadQueue(name string, env map[string]string, tool bool) (Queue, error) {
	p := QueuePrefix(name) + "_"
	q := Queue{Name: name}
	shards, ok := env[p+"SHARDS"]
	switch {
	case ok:
		n, err := strconv.Atoi(strings.TrimSpace(shards))
		if err != nil {
			return q, &Error{Var: p + "SHARDS", Value: shards, Reason: "not an integer"}
		}
		if tool && n == 0 { // 0 stands for "not set" from here on
			return q, &Error{Var: p + "SHARDS", Value: shards, Reason: fmt.Sprintf("must be 1 to %d", shard.MaxShards)}
		}
		q.Shards = n
	case !tool:
		return q, &Error{Var: p + "SHARDS", Reason: "required, not set"}
	}
	if q.Exchange, ok = env[p+"EXCHANGE"]; !ok && !tool {
		return q, &Error{Var: p + "EXCHANGE", Reason: "required, not set (empty means the default exchange)"}
	}
	if v, ok := env[p+"MAX_RATE"]; ok && strings.TrimSpace(v) != "" {
		r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || (r > 0 && r < 0.001) {
			return q, &Error{Var: p + "MAX_RATE", Value: v, Reason: "want a number of tasks per second, 0 (no limit) or 0.001 and more"}
		}
		q.MaxRate = r
	}
	if v, ok := env[p+"DRAIN_RATE"]; ok && strings.TrimSpace(v) != "" {
		r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(r) || math.IsInf(r, 0) || r < 0.001 {
			return q, &Error{Var: p + "DRAIN_RATE", Value: v, Reason: "want a number of tasks per second, 0.001 and more"}
		}
		q.DrainRate = r
	}
	q.RoutingKey = env[p+"ROUTING_KEY"]
	if q.RoutingKey == "" {
		q.RoutingKey = name
	}
	if err := loadUnroutable(&q, p, env); err != nil {
		return q, err
	}
	if err := loadIngress(&q, p, env); err != nil {
		return q, err
	}
	return q, nil
}

// loadUnroutable reads a queue's UNROUTABLE: retry, dead-letter,
// dead-letter:N or drop. Unset stays "": retry.
func loadUnroutable(q *Queue, p string, env map[string]string) error {
	v, ok := env[p+"UNROUTABLE"]
	if !ok || strings.TrimSpace(v) == "" {
		return nil
	}
	mode, n, hasN := strings.Cut(strings.TrimSpace(v), ":")
	switch {
	case (mode == UnroutableRetry || mode == UnroutableDrop) && !hasN:
		q.Unroutable = mode
		return nil
	case mode == UnroutableDeadLetter && !hasN:
		q.Unroutable = mode
		return nil
	case mode == UnroutableDeadLetter:
		a, err := strconv.Atoi(strings.TrimSpace(n))
		if err == nil && a >= 1 && a <= 1000 {
			q.Unroutable, q.UnroutableAttempts = mode, a
			return nil
		}
		return &Error{Var: p + "UNROUTABLE", Value: v, Reason: "dead-letter:N wants N, the returns before a task is dead-lettered, an integer from 1 to 1000"}
	}
	return &Error{Var: p + "UNROUTABLE", Value: v, Reason: "want retry, dead-letter, dead-letter:N (N from 1 to 1000) or drop"}
}

// loadIngress reads a queue's INGRESS_* variables.
func loadIngress(q *Queue, p string, env map[string]string) error {
	q.IngressExchange = env[p+"INGRESS_EXCHANGE"]
	if len(q.IngressExchange) > 255 {
		return &Error{Var: p + "INGRESS_EXCHANGE", Value: q.IngressExchange, Reason: "over AMQP's 255 bytes"}
	}
	// Unset stays zero: the ingress applies the defaults (as DrainRate).
	if v, ok := env[p+"INGRESS_PREFETCH"]; ok && strings.TrimSpace(v) != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > 65535 {
			return &Error{Var: p + "INGRESS_PREFETCH", Value: v, Reason: "want an integer, 1 to 65535"}
		}
		q.IngressPrefetch = n
	}
	if v, ok := env[p+"INGRESS_QUEUE_TYPE"]; ok && strings.TrimSpace(v) != "" {
		switch t := strings.TrimSpace(v); t {
		case "quorum", "classic":
			q.IngressQueueType = t
		default:
			return &Error{Var: p + "INGRESS_QUEUE_TYPE", Value: v, Reason: "want quorum or classic"}
		}
	}
	if v, ok := env[p+"INGRESS_MAX_DELAY"]; ok && strings.TrimSpace(v) != "" {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < time.Second {
			return &Error{Var: p + "INGRESS_MAX_DELAY", Value: v, Reason: "want a duration of at least 1s (Go syntax, such as 720h)"}
		}
		q.IngressMaxDelay = d
	}
	return nil
}

// translate turns envconfig's errors into one line naming variable and value.
func translate(err error, env map[string]string) error {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		reason := "not a " + pe.TypeName
		switch pe.TypeName {
		case "Duration", "time.Duration":
			reason = "not a duration (use Go syntax such as 500ms, 30s, 2m)"
		case "int":
			reason = "not an integer"
		}
		return &Error{Var: pe.KeyName, Value: pe.Value, Reason: reason}
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "required key ") {
		key := strings.TrimSuffix(strings.TrimPrefix(msg, "required key "), " missing value")
		return &Error{Var: key, Reason: "required, not set"}
	}
	return errors.New(redact.String(msg))
}

// Validate rejects settings that would misbehave later.
func (s *Settings) Validate() error { return s.validate(false) }

// validate is Validate; with tool, queues and shard counts may be missing.
func (s *Settings) validate(tool bool) error {
	v := func(name string) string { return Prefix + "_" + name }
	if len(s.Queues) == 0 && !tool {
		return &Error{Var: v("QUEUES"), Reason: "no queue given"}
	}
	if err := validRedisURL(s.RedisURL); err != nil {
		return &Error{Var: v("REDIS_URL"), Value: s.RedisURL, Reason: urlReason(s.RedisURL, err)}
	}
	if err := validAMQPURLs(s.AMQPURLs()); err != nil {
		return err
	}
	if s.AMQPNodeOrder != NodeOrderShuffle && s.AMQPNodeOrder != NodeOrderListed {
		return &Error{Var: v("AMQP_NODE_ORDER"), Value: s.AMQPNodeOrder, Reason: "want shuffle or listed"}
	}
	if err := validTLS("REDIS", s.RedisURL, "rediss", s.RedisTLSFiles()); err != nil {
		return err
	}
	if err := validTLS("AMQP", amqpsFirst(s.AMQPURLs()), "amqps", s.AMQPTLSFiles()); err != nil {
		return err
	}
	if reason := httpAddrReason(s.HTTPAddr); reason != "" {
		return &Error{Var: v("HTTP_ADDR"), Value: s.HTTPAddr, Reason: reason}
	}
	if reason := authTokenReason(s.HTTPAuthToken); reason != "" {
		// The value is a secret: the error names its length only.
		return &Error{Var: v("HTTP_AUTH_TOKEN"), Value: fmt.Sprintf("(%d characters, not shown)", len(s.HTTPAuthToken)), Reason: reason}
	}
	if !validPrefix(s.KeyPrefix) {
		return &Error{Var: v("KEY_PREFIX"), Value: s.KeyPrefix, Reason: "want 1 to 64 characters without {, } or whitespace"}
	}
	durations := []struct {
		name string
		d    time.Duration
	}{
		{"LEASE", s.Lease}, {"POLL_INTERVAL", s.PollInterval}, {"IDLE_POLL_INTERVAL", s.IdlePollInterval}, {"CONFIRM_TIMEOUT", s.ConfirmTimeout},
		{"SHUTDOWN_TIMEOUT", s.ShutdownTimeout}, {"RETRY_MIN", s.RetryMin}, {"RETRY_MAX", s.RetryMax},
		{"STATS_INTERVAL", s.StatsInterval}, {"STALL_AFTER", s.StallAfter},
	}
	for _, d := range durations {
		if d.d <= 0 {
			return &Error{Var: v(d.name), Value: d.d.String(), Reason: "must be a positive duration"}
		}
	}
	if s.Lookahead < 0 || s.Lookahead > 10*time.Second {
		return &Error{Var: v("LOOKAHEAD"), Value: s.Lookahead.String(), Reason: "must be 0 to 10s"}
	}
	if s.PublishTick < 0 || s.PublishTick > time.Second {
		return &Error{Var: v("PUBLISH_TICK"), Value: s.PublishTick.String(), Reason: "must be 0 to 1s"}
	}
	if s.ClockReadGap < 0 || s.ClockReadGap > time.Second {
		return &Error{Var: v("CLOCK_READ_GAP"), Value: s.ClockReadGap.String(), Reason: "must be 0 to 1s"}
	}
	if s.Lease < time.Second {
		return &Error{Var: v("LEASE"), Value: s.Lease.String(), Reason: "must be at least 1s"}
	}
	if s.StatsInterval < time.Second {
		return &Error{Var: v("STATS_INTERVAL"), Value: s.StatsInterval.String(), Reason: "must be at least 1s (each read costs Redis a script call per shard)"}
	}
	if s.LivenessTimeout != 0 && (s.LivenessTimeout < 400*time.Millisecond || s.LivenessTimeout > s.Lease/2) {
		return &Error{Var: v("LIVENESS_TIMEOUT"), Value: s.LivenessTimeout.String(),
			Reason: fmt.Sprintf("must be 0 (off) or 400ms to half of DISPATCHER_LEASE (%s)", s.Lease)}
	}
	if s.ConfirmTimeout >= s.Lease {
		return &Error{Var: v("CONFIRM_TIMEOUT"), Value: s.ConfirmTimeout.String(),
			Reason: fmt.Sprintf("must be shorter than DISPATCHER_LEASE (%s), or a live instance's tasks are handed out again", s.Lease)}
	}
	if s.RetryMax < s.RetryMin {
		return &Error{Var: v("RETRY_MAX"), Value: s.RetryMax.String(), Reason: "must not be shorter than DISPATCHER_RETRY_MIN"}
	}
	ints := []struct {
		name     string
		n, lo, h int
		why      string
	}{
		// Up to 10,000 was valid before MaxBatchSize: the daemon takes more
		// than MaxBatchSize as MaxBatchSize, with a warning.
		{"BATCH_SIZE", s.BatchSize, 1, 10000, ""},
		{"PIPELINE", s.Pipeline, 1, 64, ""},
		{"MAX_MESSAGE_BYTES", s.MaxMessageBytes, 1, 512 << 20, ""}, {"MAX_ATTEMPTS", s.MaxAttempts, 1, 1000, ""},
	}
	for _, n := range ints {
		if n.n < n.lo || n.n > n.h {
			return &Error{Var: v(n.name), Value: strconv.Itoa(n.n), Reason: fmt.Sprintf("must be %d to %d%s", n.lo, n.h, n.why)}
		}
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return &Error{Var: v("LOG_LEVEL"), Value: s.LogLevel, Reason: "want debug, info, warn or error"}
	}
	switch s.LogFormat {
	case "text", "json":
	default:
		return &Error{Var: v("LOG_FORMAT"), Value: s.LogFormat, Reason: "want text or json"}
	}
	for _, q := range append(s.QueueSettings[:len(s.QueueSettings):len(s.QueueSettings)], s.Extra...) {
		p := QueuePrefix(q.Name) + "_"
		if tool && q.Shards == 0 {
			// not set: the command reads the count recorded in Redis
		} else if q.Shards < 1 || q.Shards > shard.MaxShards {
			return &Error{Var: p + "SHARDS", Value: strconv.Itoa(q.Shards), Reason: fmt.Sprintf("must be 1 to %d", shard.MaxShards)}
		}
		if len(q.Exchange) > 255 {
			return &Error{Var: p + "EXCHANGE", Value: q.Exchange, Reason: "longer than 255 bytes"}
		}
		if len(q.RoutingKey) > 255 {
			return &Error{Var: p + "ROUTING_KEY", Value: q.RoutingKey, Reason: "longer than 255 bytes"}
		}
	}
	return nil
}

// RedisTLSFiles are the TLS files for the Redis connection.
func (s *Settings) RedisTLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: s.RedisCAFile, Cert: s.RedisCertFile, Key: s.RedisKeyFile}
}

// AMQPTLSFiles are the TLS files for the broker connection.
func (s *Settings) AMQPTLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: s.AMQPCAFile, Cert: s.AMQPCertFile, Key: s.AMQPKeyFile}
}

// validTLS checks that TLS files go with a TLS URL and can be loaded, so a
// bad path fails at start rather than at the first connection.
func validTLS(name, url, scheme string, f tlsfiles.Files) error {
	if f.Empty() {
		return nil
	}
	v := func(suffix string) string { return Prefix + "_" + name + "_" + suffix }
	first, value := v("CA_FILE"), f.CA
	switch {
	case f.Cert != "":
		first, value = v("CERT_FILE"), f.Cert
	case f.Key != "":
		first, value = v("KEY_FILE"), f.Key
	}
	if !strings.HasPrefix(strings.ToLower(url), scheme) {
		return &Error{Var: first, Value: value,
			Reason: fmt.Sprintf("TLS files are set but %s holds no %s URL", v("URL"), scheme+"://")}
	}
	if (f.Cert == "") != (f.Key == "") {
		return &Error{Var: first, Value: value, Reason: fmt.Sprintf("%s and %s must be set together", v("CERT_FILE"), v("KEY_FILE"))}
	}
	// A file that cannot be read is named by its own variable.
	for _, file := range []struct{ name, path string }{{v("CA_FILE"), f.CA}, {v("CERT_FILE"), f.Cert}, {v("KEY_FILE"), f.Key}} {
		if file.path == "" {
			continue
		}
		fh, err := os.Open(file.path)
		if err == nil {
			fh.Close()
			continue
		}
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is the value, shown already
		}
		return &Error{Var: file.name, Value: file.path, Reason: "cannot read it: " + err.Error()}
	}
	if _, err := f.Config(); err != nil {
		return &Error{Var: first, Value: value, Reason: err.Error()}
	}
	return nil
}

func validPrefix(p string) bool {
	if p == "" || len(p) > 64 {
		return false
	}
	return !strings.ContainsAny(p, "{} \t\r\n")
}

func validRedisURL(u string) error {
	_, err := redisconn.Parse(u)
	return err
}

// Orders of DISPATCHER_AMQP_NODE_ORDER.
const (
	NodeOrderShuffle = "shuffle"
	NodeOrderListed  = "listed"
)

// SplitAMQPURLs splits a DISPATCHER_AMQP_URL value into its URLs,
// trimmed of spaces (see redact.SplitList).
func SplitAMQPURLs(list string) []string {
	out := redact.SplitList(list)
	for i, u := range out {
		out[i] = strings.TrimSpace(u)
	}
	return out
}

// AMQPURLs are the broker nodes' URLs, as listed.
func (s *Settings) AMQPURLs() []string { return SplitAMQPURLs(s.AMQPURL) }

// validAMQPURLs checks every URL of the list on its own: an error names
// the variable, which URL of the list, and that URL only (redacted).
func validAMQPURLs(urls []string) error {
	seen := map[string]int{}
	for i, u := range urls {
		which := ""
		if len(urls) > 1 {
			which = fmt.Sprintf("URL %d of %d: ", i+1, len(urls))
		}
		uri, err := amqp.ParseURI(u)
		if err == nil && strings.HasSuffix(u, ",") {
			// A vhost may be named ",", but a list that ends in a comma
			// is a URL left out, far more likely.
			err = errors.New("ends with a comma: a URL missing from the list?")
		}
		if written := redact.Password(u); err == nil && written != "" && uri.Password != written {
			// An unencoded '@' then '/', '?' or '#' in the password makes
			// the parser take part of it for the host, which logs and
			// metrics show as the node's name.
			if dec, derr := url.PathUnescape(written); derr != nil || dec != uri.Password {
				err = errors.New("the password holds an unencoded '@', '/', '?' or '#': percent-encode it")
			}
		}
		if err != nil {
			return &Error{Var: Prefix + "_AMQP_URL", Value: u, Reason: which + urlReason(u, err)}
		}
		node := net.JoinHostPort(strings.ToLower(uri.Host), strconv.Itoa(uri.Port))
		if j, dup := seen[node]; dup {
			return &Error{Var: Prefix + "_AMQP_URL", Value: u,
				Reason: fmt.Sprintf("%snode %s is listed already as URL %d", which, node, j+1)}
		}
		seen[node] = i
	}
	return nil
}

// amqpsFirst is the first amqps:// URL of the list, or the first URL: TLS
// files need at least one node reached over TLS, and in a mixed list they
// apply to the amqps:// nodes only.
func amqpsFirst(urls []string) string {
	for _, u := range urls {
		if strings.HasPrefix(strings.ToLower(u), "amqps://") {
			return u
		}
	}
	return urls[0]
}

// checkUnknown rejects DISPATCHER_* variables nobody reads: a typo in a
// setting name would otherwise silently leave its default in force.
func checkUnknown(env map[string]string, s *Settings) error {
	known := map[string]bool{}
	for _, v := range vars(Prefix, &Settings{}) {
		known[v.Key] = true
	}
	for _, q := range append(s.QueueSettings[:len(s.QueueSettings):len(s.QueueSettings)], s.Extra...) {
		for _, v := range vars(QueuePrefix(q.Name), &Queue{}) {
			known[v.Key] = true
		}
	}
	var unknown []string
	for k := range env {
		// DISPATCHER_TEST_* belong to the test suite, not the daemon.
		if strings.HasPrefix(k, Prefix+"_") && !strings.HasPrefix(k, Prefix+"_TEST_") && !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	k := unknown[0]
	return &Error{Var: k, Value: env[k], Reason: unknownReason(k, known, s.Queues)}
}

// unknownReason says why k is not read: a queue's variable for a queue
// not served, or the known name it is closest to, if one is close.
func unknownReason(k string, known map[string]bool, queues []string) string {
	var reason string
	rest := strings.TrimPrefix(k, Prefix+"_QUEUE_")
	for _, v := range vars("", &Queue{}) {
		suffix := v.Key // "_SHARDS"
		if name, ok := strings.CutSuffix(rest, suffix); ok && rest != k && name != "" {
			served := strings.Join(queues, ",")
			if served == "" {
				served = "not set"
			}
			reason = fmt.Sprintf("%s is set but %s is not in %s_QUEUES (%s)", k, name, Prefix, served)
			break
		}
	}
	if near := closest(k, known); near != "" {
		if reason == "" {
			return "unknown variable; did you mean " + near + "?"
		}
		return reason + "; did you mean " + near + "?"
	}
	if reason == "" {
		reason = "unknown variable (misspelt, or a queue missing from " + Prefix + "_QUEUES?)"
	}
	return reason
}

// closest is the known name nearest to k by edit distance, if it is near
// enough to be a slip (a couple of characters, more in a long name); ""
// if none is, or two are equally near.
func closest(k string, known map[string]bool) string {
	best, bestD, tie := "", 0, false
	for name := range known {
		d := editDistance(k, name)
		switch {
		case best == "" || d < bestD:
			best, bestD, tie = name, d, false
		case d == bestD:
			tie = true
		}
	}
	if best == "" || tie || bestD > max(2, len(strings.TrimPrefix(k, Prefix+"_"))/4) {
		return ""
	}
	return best
}

// editDistance counts the insertions, deletions, substitutions and swaps
// of neighbours that turn a into b (optimal string alignment).
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// httpAddrReason says what is wrong with DISPATCHER_HTTP_ADDR, "" if
// nothing: empty (no endpoint), or host:port or :port with a port number,
// so that a mistake such as "localhost" stops the start like any other bad
// setting rather than failing later, after the wait for Redis.
func httpAddrReason(addr string) string {
	if addr == "" {
		return ""
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "want host:port or :port, e.g. 127.0.0.1:9090 (" + strings.TrimPrefix(err.Error(), "address "+addr+": ") + ")"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "want a port 0 to 65535 after the colon"
	}
	return ""
}

// authTokenReason says what is wrong with a DISPATCHER_HTTP_AUTH_TOKEN, or
// "" if it is fine (empty: no check). A short token is guessable; a
// character outside printable ASCII cannot be sent in a header as is.
func authTokenReason(tok string) string {
	if tok == "" {
		return ""
	}
	if len(tok) < 16 || len(tok) > 4096 {
		return "want 16 to 4096 characters"
	}
	for _, r := range tok {
		if r <= ' ' || r > '~' {
			return "want printable ASCII characters without spaces"
		}
	}
	return ""
}
