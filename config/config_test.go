package config_test

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// clearEnv unsets every DISPATCHER_* variable inherited from the
// environment and restores them when the test ends. t.Setenv(k, "") is not
// enough: Load treats a set-but-empty variable as set.
func clearEnv(t testing.TB) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, config.Prefix+"_") {
			continue
		}
		if err := os.Unsetenv(k); err != nil {
			t.Fatalf("unset %s: %v", k, err)
		}
		t.Cleanup(func() { os.Setenv(k, v) })
	}
}

// setEnv clears the DISPATCHER_* environment, then sets env.
func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	clearEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// base is the smallest valid environment: one queue, orders.
func base() map[string]string {
	return map[string]string{
		"DISPATCHER_QUEUES":                "orders",
		"DISPATCHER_QUEUE_ORDERS_SHARDS":   "16",
		"DISPATCHER_QUEUE_ORDERS_EXCHANGE": "ex",
	}
}

// with returns base() changed by set (an empty-string value is kept as
// set-but-empty) and without the variables in unset.
func with(set map[string]string, unset ...string) map[string]string {
	env := base()
	for k, v := range set {
		env[k] = v
	}
	for _, k := range unset {
		delete(env, k)
	}
	return env
}

func TestLoadDefaults(t *testing.T) {
	setEnv(t, base())
	s, err := config.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := &config.Settings{
		RedisURL:         "redis://localhost:6379/0",
		AMQPURL:          "amqp://guest:guest@localhost:5672/",
		AMQPNodeOrder:    "shuffle",
		KeyPrefix:        "dq",
		Queues:           []string{"orders"},
		Lease:            30 * time.Second,
		HTTPAddr:         "",
		BatchSize:        500,
		Pipeline:         4,
		PollInterval:     50 * time.Millisecond,
		IdlePollInterval: 500 * time.Millisecond,
		Lookahead:        100 * time.Millisecond,
		ClockReadGap:     5 * time.Millisecond,
		ConfirmTimeout:   10 * time.Second,
		LivenessTimeout:  1500 * time.Millisecond,
		ShutdownTimeout:  10 * time.Second,
		MaxMessageBytes:  16 << 20,
		MaxAttempts:      5,
		RetryMin:         time.Second,
		RetryMax:         time.Minute,
		StatsInterval:    time.Second,
		StallAfter:       30 * time.Second,
		LogLevel:         "info",
		LogFormat:        "text",
		QueueSettings:    []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("Load() =\n%+v\nwant\n%+v", s, want)
	}
}

func TestLoadValid(t *testing.T) {
	tests := []struct {
		name   string
		env    map[string]string
		check  func(t *testing.T, s *config.Settings)
		queues []config.Queue
	}{
		{
			name: "several queues, names with dot and dash",
			env: map[string]string{
				"DISPATCHER_QUEUES":                       " orders , mail.out-2,Bulk_Q",
				"DISPATCHER_QUEUE_ORDERS_SHARDS":          "16",
				"DISPATCHER_QUEUE_ORDERS_EXCHANGE":        "ex",
				"DISPATCHER_QUEUE_MAIL_OUT_2_SHARDS":      " 4096 ",
				"DISPATCHER_QUEUE_MAIL_OUT_2_EXCHANGE":    "mail",
				"DISPATCHER_QUEUE_MAIL_OUT_2_ROUTING_KEY": "rk.mail",
				"DISPATCHER_QUEUE_BULK_Q_SHARDS":          "1",
				"DISPATCHER_QUEUE_BULK_Q_EXCHANGE":        "", // the default exchange
			},
			queues: []config.Queue{
				{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"},
				{Name: "mail.out-2", Shards: 4096, Exchange: "mail", RoutingKey: "rk.mail"},
				{Name: "Bulk_Q", Shards: 1, Exchange: "", RoutingKey: "Bulk_Q"},
			},
			check: func(t *testing.T, s *config.Settings) {
				if want := []string{"orders", "mail.out-2", "Bulk_Q"}; !reflect.DeepEqual(s.Queues, want) {
					t.Errorf("Queues = %q, want %q", s.Queues, want)
				}
			},
		},
		{
			name: "every instance-wide setting",
			env: with(map[string]string{
				"DISPATCHER_REDIS_URL":         "rediss://user:pw@redis.example:6380/3",
				"DISPATCHER_AMQP_URL":          "amqps://user:pw@mq.example:5671/vhost",
				"DISPATCHER_KEY_PREFIX":        "tasks",
				"DISPATCHER_LEASE":             "2m",
				"DISPATCHER_HTTP_ADDR":         "127.0.0.1:9090",
				"DISPATCHER_BATCH_SIZE":        "1000",
				"DISPATCHER_PIPELINE":          "64",
				"DISPATCHER_POLL_INTERVAL":     "1s",
				"DISPATCHER_CONFIRM_TIMEOUT":   "119s",
				"DISPATCHER_SHUTDOWN_TIMEOUT":  "5s",
				"DISPATCHER_MAX_MESSAGE_BYTES": "1024",
				"DISPATCHER_MAX_ATTEMPTS":      "1",
				"DISPATCHER_RETRY_MIN":         "100ms",
				"DISPATCHER_RETRY_MAX":         "100ms",
				"DISPATCHER_LOG_LEVEL":         "debug",
				"DISPATCHER_LOG_FORMAT":        "json",
			}),
			queues: []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
			check: func(t *testing.T, s *config.Settings) {
				got := config.Settings{
					RedisURL: s.RedisURL, AMQPURL: s.AMQPURL, KeyPrefix: s.KeyPrefix, Lease: s.Lease,
					HTTPAddr: s.HTTPAddr, BatchSize: s.BatchSize, Pipeline: s.Pipeline,
					PollInterval: s.PollInterval, ConfirmTimeout: s.ConfirmTimeout,
					ShutdownTimeout: s.ShutdownTimeout, MaxMessageBytes: s.MaxMessageBytes,
					MaxAttempts: s.MaxAttempts, RetryMin: s.RetryMin, RetryMax: s.RetryMax,
					LogLevel: s.LogLevel, LogFormat: s.LogFormat,
				}
				want := config.Settings{
					RedisURL: "rediss://user:pw@redis.example:6380/3", AMQPURL: "amqps://user:pw@mq.example:5671/vhost",
					KeyPrefix: "tasks", Lease: 2 * time.Minute, HTTPAddr: "127.0.0.1:9090", BatchSize: 1000,
					Pipeline: 64, PollInterval: time.Second, ConfirmTimeout: 119 * time.Second,
					ShutdownTimeout: 5 * time.Second, MaxMessageBytes: 1024, MaxAttempts: 1,
					RetryMin: 100 * time.Millisecond, RetryMax: 100 * time.Millisecond,
					LogLevel: "debug", LogFormat: "json",
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("settings =\n%+v\nwant\n%+v", got, want)
				}
			},
		},
		{
			// The code reads full variable names only; envconfig's fallback
			// to unprefixed names must not pick these up.
			name: "unprefixed variables are ignored",
			env: with(map[string]string{
				"REDIS_URL":     "http://not-redis",
				"AMQP_URL":      "http://not-amqp",
				"QUEUES":        "other",
				"LEASE":         "abc",
				"SHARDS":        "x",
				"EXCHANGE":      "wrong",
				"ROUTING_KEY":   "wrong",
				"BATCH_SIZE":    "0",
				"KEY_PREFIX":    "{bad}",
				"DISPATCHERX_Y": "z",
			}),
			queues: []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
			check: func(t *testing.T, s *config.Settings) {
				if s.RedisURL != "redis://localhost:6379/0" || s.Lease != 30*time.Second || s.BatchSize != 500 || s.KeyPrefix != "dq" {
					t.Errorf("an unprefixed variable was read: %+v", s)
				}
			},
		},
		{
			// Finding 9 of issue 8: a short lease alone used to stop the
			// daemon over a CONFIRM_TIMEOUT the user never set.
			name:   "short lease alone derives the confirm timeout",
			env:    with(map[string]string{"DISPATCHER_LEASE": "5s"}),
			queues: []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
			check: func(t *testing.T, s *config.Settings) {
				if s.Lease != 5*time.Second || s.ConfirmTimeout <= 0 || s.ConfirmTimeout > s.Lease/2 {
					t.Errorf("lease %s, confirm timeout %s: want a derived timeout well inside the lease", s.Lease, s.ConfirmTimeout)
				}
			},
		},
		{
			name:   "1s lease alone",
			env:    with(map[string]string{"DISPATCHER_LEASE": "1s"}),
			queues: []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
			check: func(t *testing.T, s *config.Settings) {
				if s.ConfirmTimeout <= 0 || s.ConfirmTimeout >= s.Lease {
					t.Errorf("confirm timeout %s for lease %s", s.ConfirmTimeout, s.Lease)
				}
				if s.LivenessTimeout != 500*time.Millisecond {
					t.Errorf("liveness timeout %s for lease %s, want half the lease", s.LivenessTimeout, s.Lease)
				}
			},
		},
		{
			name:   "liveness off",
			env:    with(map[string]string{"DISPATCHER_LIVENESS_TIMEOUT": "0"}),
			queues: []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
			check: func(t *testing.T, s *config.Settings) {
				if s.LivenessTimeout != 0 {
					t.Errorf("liveness timeout %s, want 0 (off)", s.LivenessTimeout)
				}
			},
		},
		{
			name:   "64-character queue name",
			env:    map[string]string{"DISPATCHER_QUEUES": strings.Repeat("q", 64), "DISPATCHER_QUEUE_" + strings.Repeat("Q", 64) + "_SHARDS": "2", "DISPATCHER_QUEUE_" + strings.Repeat("Q", 64) + "_EXCHANGE": "ex"},
			queues: []config.Queue{{Name: strings.Repeat("q", 64), Shards: 2, Exchange: "ex", RoutingKey: strings.Repeat("q", 64)}},
		},
		{
			name: "unroutable modes",
			env: map[string]string{
				"DISPATCHER_QUEUES":             "a,b,c,d,e",
				"DISPATCHER_QUEUE_A_SHARDS":     "1",
				"DISPATCHER_QUEUE_A_EXCHANGE":   "ex",
				"DISPATCHER_QUEUE_A_UNROUTABLE": "retry",
				"DISPATCHER_QUEUE_B_SHARDS":     "1",
				"DISPATCHER_QUEUE_B_EXCHANGE":   "ex",
				"DISPATCHER_QUEUE_B_UNROUTABLE": " dead-letter ",
				"DISPATCHER_QUEUE_C_SHARDS":     "1",
				"DISPATCHER_QUEUE_C_EXCHANGE":   "ex",
				"DISPATCHER_QUEUE_C_UNROUTABLE": "dead-letter:3",
				"DISPATCHER_QUEUE_D_SHARDS":     "1",
				"DISPATCHER_QUEUE_D_EXCHANGE":   "ex",
				"DISPATCHER_QUEUE_D_UNROUTABLE": "drop",
				"DISPATCHER_QUEUE_E_SHARDS":     "1",
				"DISPATCHER_QUEUE_E_EXCHANGE":   "ex",
				"DISPATCHER_QUEUE_E_UNROUTABLE": "",
			},
			queues: []config.Queue{
				{Name: "a", Shards: 1, Exchange: "ex", RoutingKey: "a", Unroutable: "retry"},
				{Name: "b", Shards: 1, Exchange: "ex", RoutingKey: "b", Unroutable: "dead-letter"},
				{Name: "c", Shards: 1, Exchange: "ex", RoutingKey: "c", Unroutable: "dead-letter", UnroutableAttempts: 3},
				{Name: "d", Shards: 1, Exchange: "ex", RoutingKey: "d", Unroutable: "drop"},
				{Name: "e", Shards: 1, Exchange: "ex", RoutingKey: "e"},
			},
		},
		{
			name:   "set-but-empty routing key falls back to the queue name",
			env:    with(map[string]string{"DISPATCHER_QUEUE_ORDERS_ROUTING_KEY": ""}),
			queues: []config.Queue{{Name: "orders", Shards: 16, Exchange: "ex", RoutingKey: "orders"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			s, err := config.Load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !reflect.DeepEqual(s.QueueSettings, tt.queues) {
				t.Errorf("QueueSettings =\n%+v\nwant\n%+v", s.QueueSettings, tt.queues)
			}
			if tt.check != nil {
				tt.check(t, s)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	long := strings.Repeat("a", 65)
	tests := []struct {
		name      string
		env       map[string]string
		wantVar   string
		wantValue string // Error.Value, the raw value
		wantText  string // must appear in the error text; defaults to wantValue
	}{
		{name: "queue name with space", env: with(map[string]string{"DISPATCHER_QUEUES": "or ders"}),
			wantVar: "DISPATCHER_QUEUES", wantValue: "or ders"},
		{name: "queue name with colon", env: with(map[string]string{"DISPATCHER_QUEUES": "a:b"}),
			wantVar: "DISPATCHER_QUEUES", wantValue: "a:b"},
		{name: "queue name with brace", env: with(map[string]string{"DISPATCHER_QUEUES": "orders,{x}"}),
			wantVar: "DISPATCHER_QUEUES", wantValue: "orders,{x}"},
		{name: "empty queue name in list", env: with(map[string]string{"DISPATCHER_QUEUES": "orders,"}),
			wantVar: "DISPATCHER_QUEUES", wantValue: "orders,"},
		{name: "65-character queue name", env: with(map[string]string{"DISPATCHER_QUEUES": long}),
			wantVar: "DISPATCHER_QUEUES", wantValue: long},
		{name: "non-ASCII queue name", env: with(map[string]string{"DISPATCHER_QUEUES": "задача"}),
			wantVar: "DISPATCHER_QUEUES", wantValue: "задача"},
		{name: "negative clock read gap", env: with(map[string]string{"DISPATCHER_CLOCK_READ_GAP": "-1ms"}),
			wantVar: "DISPATCHER_CLOCK_READ_GAP", wantValue: "-1ms"},
		{name: "clock read gap over 1s", env: with(map[string]string{"DISPATCHER_CLOCK_READ_GAP": "2s"}),
			wantVar: "DISPATCHER_CLOCK_READ_GAP", wantValue: "2s"},
		{name: "no queues", env: with(map[string]string{"DISPATCHER_QUEUES": ""}),
			wantVar: "DISPATCHER_QUEUES", wantValue: ""},
		{name: "QUEUES unset", env: with(nil, "DISPATCHER_QUEUES"),
			wantVar: "DISPATCHER_QUEUES", wantValue: ""},
		{name: "two queues share NAME", env: map[string]string{
			"DISPATCHER_QUEUES":             "a.b,a_b",
			"DISPATCHER_QUEUE_A_B_SHARDS":   "4",
			"DISPATCHER_QUEUE_A_B_EXCHANGE": "ex",
		}, wantVar: "DISPATCHER_QUEUES", wantValue: "a.b,a_b"},
		{name: "two queues differing in case", env: map[string]string{
			"DISPATCHER_QUEUES":                "Orders,orders",
			"DISPATCHER_QUEUE_ORDERS_SHARDS":   "4",
			"DISPATCHER_QUEUE_ORDERS_EXCHANGE": "ex",
		}, wantVar: "DISPATCHER_QUEUES", wantValue: "Orders,orders"},
		{name: "shards 0", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARDS": "0"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARDS", wantValue: "0"},
		{name: "shards negative", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARDS": "-3"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARDS", wantValue: "-3"},
		{name: "shards 4097", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARDS": "4097"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARDS", wantValue: "4097"},
		{name: "shards not a number", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARDS": "x"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARDS", wantValue: "x"},
		{name: "shards empty", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARDS": ""}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARDS", wantValue: ""},
		{name: "shards missing", env: with(nil, "DISPATCHER_QUEUE_ORDERS_SHARDS"),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARDS", wantValue: ""},
		{name: "exchange missing", env: with(nil, "DISPATCHER_QUEUE_ORDERS_EXCHANGE"),
			wantVar: "DISPATCHER_QUEUE_ORDERS_EXCHANGE", wantValue: ""},
		{name: "exchange too long", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_EXCHANGE": strings.Repeat("e", 256)}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_EXCHANGE", wantValue: strings.Repeat("e", 256)},
		{name: "routing key too long", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_ROUTING_KEY": strings.Repeat("r", 256)}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_ROUTING_KEY", wantValue: strings.Repeat("r", 256)},
		{name: "second queue's shards missing", env: with(map[string]string{"DISPATCHER_QUEUES": "orders,mail.out-2", "DISPATCHER_QUEUE_MAIL_OUT_2_EXCHANGE": "ex"}),
			wantVar: "DISPATCHER_QUEUE_MAIL_OUT_2_SHARDS", wantValue: ""},
		{name: "redis URL wrong scheme", env: with(map[string]string{"DISPATCHER_REDIS_URL": "http://x"}),
			wantVar: "DISPATCHER_REDIS_URL", wantValue: "http://x"},
		{name: "redis URL bad port", env: with(map[string]string{"DISPATCHER_REDIS_URL": "redis://:pw@host:notaport"}),
			wantVar: "DISPATCHER_REDIS_URL", wantValue: "redis://:pw@host:notaport", wantText: "host:notaport"},
		{name: "redis URL bad database", env: with(map[string]string{"DISPATCHER_REDIS_URL": "redis://host:6379/db"}),
			wantVar: "DISPATCHER_REDIS_URL", wantValue: "redis://host:6379/db"},
		{name: "redis URL unknown option", env: with(map[string]string{"DISPATCHER_REDIS_URL": "redis://host:6379/0?bogus=1"}),
			wantVar: "DISPATCHER_REDIS_URL", wantValue: "redis://host:6379/0?bogus=1"},
		{name: "redis URL empty", env: with(map[string]string{"DISPATCHER_REDIS_URL": ""}),
			wantVar: "DISPATCHER_REDIS_URL", wantValue: ""},
		{name: "AMQP URL wrong scheme", env: with(map[string]string{"DISPATCHER_AMQP_URL": "http://host:5672/"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "http://host:5672/"},
		{name: "AMQP URL bad escape", env: with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://host:5672/%zz"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "amqp://host:5672/%zz"},
		{name: "AMQP URL bad port", env: with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://host:notaport/"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "amqp://host:notaport/"},
		{name: "AMQP URL list, second bad", env: with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://h1:5672/,amqp://h2:notaport/"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "amqp://h2:notaport/", wantText: "URL 2 of 2"},
		{name: "AMQP URL list, node twice", env: with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://u:p@h1:5672/a, amqp://h1/b"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "amqp://h1/b", wantText: "node h1:5672 is listed already as URL 1"},
		{name: "AMQP URL list, node twice in other case", env: with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://H1:5672/,amqp://h1:5672/"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "amqp://h1:5672/", wantText: "listed already"},
		{name: "AMQP URL list, trailing comma", env: with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://h1:5672/,"}),
			wantVar: "DISPATCHER_AMQP_URL", wantValue: "amqp://h1:5672/,"},
		{name: "AMQP node order unknown", env: with(map[string]string{"DISPATCHER_AMQP_NODE_ORDER": "random"}),
			wantVar: "DISPATCHER_AMQP_NODE_ORDER", wantValue: "random", wantText: "shuffle or listed"},
		{name: "key prefix with brace", env: with(map[string]string{"DISPATCHER_KEY_PREFIX": "a{b"}),
			wantVar: "DISPATCHER_KEY_PREFIX", wantValue: "a{b"},
		{name: "key prefix empty", env: with(map[string]string{"DISPATCHER_KEY_PREFIX": ""}),
			wantVar: "DISPATCHER_KEY_PREFIX", wantValue: ""},
		{name: "HTTP address without port", env: with(map[string]string{"DISPATCHER_HTTP_ADDR": "localhost"}),
			wantVar: "DISPATCHER_HTTP_ADDR", wantValue: "localhost", wantText: "want host:port or :port"},
		{name: "HTTP address port alone without colon", env: with(map[string]string{"DISPATCHER_HTTP_ADDR": "9090"}),
			wantVar: "DISPATCHER_HTTP_ADDR", wantValue: "9090"},
		{name: "HTTP address port out of range", env: with(map[string]string{"DISPATCHER_HTTP_ADDR": "127.0.0.1:99999"}),
			wantVar: "DISPATCHER_HTTP_ADDR", wantValue: "127.0.0.1:99999", wantText: "port 0 to 65535"},
		{name: "HTTP address named port", env: with(map[string]string{"DISPATCHER_HTTP_ADDR": ":http"}),
			wantVar: "DISPATCHER_HTTP_ADDR", wantValue: ":http"},
		{name: "negative lease", env: with(map[string]string{"DISPATCHER_LEASE": "-5s"}),
			wantVar: "DISPATCHER_LEASE", wantValue: "-5s"},
		{name: "liveness under 400ms", env: with(map[string]string{"DISPATCHER_LIVENESS_TIMEOUT": "100ms"}),
			wantVar: "DISPATCHER_LIVENESS_TIMEOUT", wantValue: "100ms"},
		{name: "liveness over half the lease", env: with(map[string]string{"DISPATCHER_LIVENESS_TIMEOUT": "20s"}),
			wantVar: "DISPATCHER_LIVENESS_TIMEOUT", wantValue: "20s"},
		{name: "zero lease", env: with(map[string]string{"DISPATCHER_LEASE": "0s"}),
			wantVar: "DISPATCHER_LEASE", wantValue: "0s"},
		{name: "lease under 1s", env: with(map[string]string{"DISPATCHER_LEASE": "500ms", "DISPATCHER_CONFIRM_TIMEOUT": "100ms"}),
			wantVar: "DISPATCHER_LEASE", wantValue: "500ms"},
		{name: "unparsable lease", env: with(map[string]string{"DISPATCHER_LEASE": "abc"}),
			wantVar: "DISPATCHER_LEASE", wantValue: "abc"},
		{name: "lease without unit", env: with(map[string]string{"DISPATCHER_LEASE": "30"}),
			wantVar: "DISPATCHER_LEASE", wantValue: "30"},
		{name: "negative poll interval", env: with(map[string]string{"DISPATCHER_POLL_INTERVAL": "-1ms"}),
			wantVar: "DISPATCHER_POLL_INTERVAL", wantValue: "-1ms"},
		{name: "zero idle poll interval", env: with(map[string]string{"DISPATCHER_IDLE_POLL_INTERVAL": "0s"}),
			wantVar: "DISPATCHER_IDLE_POLL_INTERVAL", wantValue: "0s"},
		{name: "confirm timeout equal to lease", env: with(map[string]string{"DISPATCHER_CONFIRM_TIMEOUT": "30s"}),
			wantVar: "DISPATCHER_CONFIRM_TIMEOUT", wantValue: "30s"},
		{name: "confirm timeout given above lease", env: with(map[string]string{"DISPATCHER_LEASE": "5s", "DISPATCHER_CONFIRM_TIMEOUT": "10s"}),
			wantVar: "DISPATCHER_CONFIRM_TIMEOUT", wantValue: "10s"},
		{name: "max rate not a number", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_MAX_RATE": "fast"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_MAX_RATE", wantValue: "fast", wantText: "tasks per second"},
		{name: "max rate negative", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_MAX_RATE": "-5"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_MAX_RATE", wantValue: "-5"},
		{name: "max rate tiny", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_MAX_RATE": "1e-12"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_MAX_RATE", wantValue: "1e-12", wantText: "0.001"},
		{name: "max rate NaN", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_MAX_RATE": "NaN"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_MAX_RATE", wantValue: "NaN"},
		{name: "unroutable unknown", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_UNROUTABLE": "ignore"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_UNROUTABLE", wantValue: "ignore", wantText: "want retry, dead-letter, dead-letter:N (N from 1 to 1000) or drop"},
		{name: "unroutable dead-letter:0", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_UNROUTABLE": "dead-letter:0"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_UNROUTABLE", wantValue: "dead-letter:0", wantText: "1 to 1000"},
		{name: "unroutable dead-letter:1001", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_UNROUTABLE": "dead-letter:1001"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_UNROUTABLE", wantValue: "dead-letter:1001", wantText: "1 to 1000"},
		{name: "unroutable dead-letter:x", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_UNROUTABLE": "dead-letter:x"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_UNROUTABLE", wantValue: "dead-letter:x", wantText: "1 to 1000"},
		{name: "unroutable drop:3", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_UNROUTABLE": "drop:3"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_UNROUTABLE", wantValue: "drop:3"},
		{name: "unroutable upper case", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_UNROUTABLE": "DROP"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_UNROUTABLE", wantValue: "DROP"},
		{name: "drain rate zero", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_DRAIN_RATE": "0"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_DRAIN_RATE", wantValue: "0", wantText: "0.001"},
		{name: "stats interval under 1s", env: with(map[string]string{"DISPATCHER_STATS_INTERVAL": "500ms"}),
			wantVar: "DISPATCHER_STATS_INTERVAL", wantValue: "500ms", wantText: "at least 1s"},
		{name: "stall after zero", env: with(map[string]string{"DISPATCHER_STALL_AFTER": "0s"}),
			wantVar: "DISPATCHER_STALL_AFTER", wantValue: "0s"},
		{name: "stall after not a duration", env: with(map[string]string{"DISPATCHER_STALL_AFTER": "soon"}),
			wantVar: "DISPATCHER_STALL_AFTER", wantValue: "soon"},
		{name: "retry max below retry min", env: with(map[string]string{"DISPATCHER_RETRY_MIN": "2s", "DISPATCHER_RETRY_MAX": "1s"}),
			wantVar: "DISPATCHER_RETRY_MAX", wantValue: "1s"},
		{name: "batch size 0", env: with(map[string]string{"DISPATCHER_BATCH_SIZE": "0"}),
			wantVar: "DISPATCHER_BATCH_SIZE", wantValue: "0"},
		{name: "batch size 10001", env: with(map[string]string{"DISPATCHER_BATCH_SIZE": "10001"}),
			wantVar: "DISPATCHER_BATCH_SIZE", wantValue: "10001"},
		{name: "batch size not a number", env: with(map[string]string{"DISPATCHER_BATCH_SIZE": "many"}),
			wantVar: "DISPATCHER_BATCH_SIZE", wantValue: "many"},
		{name: "pipeline 65", env: with(map[string]string{"DISPATCHER_PIPELINE": "65"}),
			wantVar: "DISPATCHER_PIPELINE", wantValue: "65"},
		{name: "max attempts 0", env: with(map[string]string{"DISPATCHER_MAX_ATTEMPTS": "0"}),
			wantVar: "DISPATCHER_MAX_ATTEMPTS", wantValue: "0"},
		{name: "max message bytes 0", env: with(map[string]string{"DISPATCHER_MAX_MESSAGE_BYTES": "0"}),
			wantVar: "DISPATCHER_MAX_MESSAGE_BYTES", wantValue: "0"},
		{name: "short HTTP auth token", env: with(map[string]string{"DISPATCHER_HTTP_AUTH_TOKEN": "hunter2"}),
			wantVar: "DISPATCHER_HTTP_AUTH_TOKEN", wantValue: "(7 characters, not shown)", wantText: "want 16 to 4096 characters"},
		{name: "HTTP auth token with a space", env: with(map[string]string{"DISPATCHER_HTTP_AUTH_TOKEN": "0123456789 abcdefgh"}),
			wantVar: "DISPATCHER_HTTP_AUTH_TOKEN", wantValue: "(19 characters, not shown)", wantText: "printable ASCII"},
		{name: "log level", env: with(map[string]string{"DISPATCHER_LOG_LEVEL": "verbose"}),
			wantVar: "DISPATCHER_LOG_LEVEL", wantValue: "verbose"},
		{name: "log format", env: with(map[string]string{"DISPATCHER_LOG_FORMAT": "xml"}),
			wantVar: "DISPATCHER_LOG_FORMAT", wantValue: "xml"},
		{name: "unknown variable (typo)", env: with(map[string]string{"DISPATCHER_LEAES": "5m"}),
			wantVar: "DISPATCHER_LEAES", wantValue: "5m"},
		{name: "unknown variable set but empty", env: with(map[string]string{"DISPATCHER_LEAES": ""}),
			wantVar: "DISPATCHER_LEAES", wantValue: ""},
		{name: "variables of a queue not served", env: with(map[string]string{"DISPATCHER_QUEUE_MAIL_SHARDS": "4"}),
			wantVar: "DISPATCHER_QUEUE_MAIL_SHARDS", wantValue: "4"},
		{name: "unknown per-queue variable", env: with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARD": "4"}),
			wantVar: "DISPATCHER_QUEUE_ORDERS_SHARD", wantValue: "4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			s, err := config.Load()
			if err == nil {
				t.Fatalf("Load() = %+v, want an error naming %s", s, tt.wantVar)
			}
			if s != nil {
				t.Errorf("Load() returned settings %+v along with error %v", s, err)
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Load() error %v (%T) is not a *config.Error", err, err)
			}
			if ce.Var != tt.wantVar || ce.Value != tt.wantValue {
				t.Errorf("Error{Var: %q, Value: %q}, want {Var: %q, Value: %q} (error: %v)", ce.Var, ce.Value, tt.wantVar, tt.wantValue, err)
			}
			text := err.Error()
			if !strings.Contains(text, tt.wantVar) {
				t.Errorf("error %q does not name the variable %s", text, tt.wantVar)
			}
			want := tt.wantText
			if want == "" {
				want = tt.wantValue
			}
			if !strings.Contains(text, want) {
				t.Errorf("error %q does not contain the bad value %q", text, want)
			}
			if strings.ContainsAny(text, "\r\n") {
				t.Errorf("error spans several lines: %q", text)
			}
		})
	}
}

func TestLoadErrorHidesPassword(t *testing.T) {
	const pw = "s3cr3tPW"
	tests := []struct{ name, key, value string }{
		{"redis bad port", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "@host:badport/0"},
		{"redis no user bad port", "DISPATCHER_REDIS_URL", "redis://:" + pw + "@host:notaport"},
		{"redis bad scheme", "DISPATCHER_REDIS_URL", "http://user:" + pw + "@host:6379/0"},
		{"redis bad database", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "@host:6379/notadb"},
		{"redis unknown option", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "@host:6379/0?bogus=1"},
		{"redis bad escape", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "@host:6379/%zz"},
		{"amqp bad escape", "DISPATCHER_AMQP_URL", "amqp://user:" + pw + "@host:5672/%zz"},
		{"amqp bad scheme", "DISPATCHER_AMQP_URL", "http://user:" + pw + "@host:5672/"},
		{"amqp bad port", "DISPATCHER_AMQP_URL", "amqp://user:" + pw + "@host:notaport/"},
		{"amqp port out of range", "DISPATCHER_AMQP_URL", "amqp://user:" + pw + "@host:99999999999/"},
		{"amqp no user", "DISPATCHER_AMQP_URL", "amqps://:" + pw + "@host:x/"},
		{"amqp list, second bad", "DISPATCHER_AMQP_URL", "amqp://user:" + pw + "@h1/,amqp://user:" + pw + "@host:5672/%zz"},
		{"amqp list, '@' and '/' in password", "DISPATCHER_AMQP_URL", "amqp://h1/,amqp://user:" + pw + "@ss/word@host:5672/"},
		{"amqp list, comma in password", "DISPATCHER_AMQP_URL", "amqp://user:" + pw + ",x@h1/,amqp://user:" + pw + ",x@host:notaport/"},
		{"misspelt URL variable", "DISPATCHER_REDIS_URI", "redis://user:" + pw + "@host:6379/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, with(map[string]string{tt.key: tt.value}))
			_, err := config.Load()
			if err == nil {
				t.Fatalf("%s=%q: Load succeeded, want an error", tt.key, tt.value)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error text reveals the password: %v", err)
			}
			if !strings.Contains(err.Error(), tt.key) {
				t.Errorf("error text %q does not name %s", err, tt.key)
			}
		})
	}
}

// A list of URLs splits only where a URL starts, so a comma in a password
// stays in its URL; schemes may be mixed, and TLS files apply to the
// amqps:// nodes.
func TestAMQPURLList(t *testing.T) {
	got := config.SplitAMQPURLs("amqp://u:a,b@h1:5672/, amqps://h2:5671/v ,AMQP://h3")
	want := []string{"amqp://u:a,b@h1:5672/", "amqps://h2:5671/v", "AMQP://h3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SplitAMQPURLs = %q, want %q", got, want)
	}
	ca := testenv.NewCerts(t).CA
	setEnv(t, with(map[string]string{
		"DISPATCHER_AMQP_URL":        "amqp://h1:5672/,amqps://h2:5671/",
		"DISPATCHER_AMQP_CA_FILE":    ca,
		"DISPATCHER_AMQP_NODE_ORDER": "listed",
	}))
	s, err := config.Load()
	if err != nil {
		t.Fatalf("mixed list with TLS files: %v", err)
	}
	if got := s.AMQPURLs(); len(got) != 2 || s.AMQPNodeOrder != "listed" {
		t.Errorf("AMQPURLs = %q, order %q", got, s.AMQPNodeOrder)
	}
	setEnv(t, with(map[string]string{"DISPATCHER_AMQP_URL": "amqp://h1:5672/,amqp://h2:5672/", "DISPATCHER_AMQP_CA_FILE": ca}))
	if _, err := config.Load(); err == nil || !strings.Contains(err.Error(), "DISPATCHER_AMQP_CA_FILE") {
		t.Errorf("TLS files with no amqps:// node: err = %v, want one naming DISPATCHER_AMQP_CA_FILE", err)
	}
}

// An operator who forgets to percent-encode a password containing '/',
// '?', '#', a space or '"' gets a URL that fails to parse (net/url then
// reports the password as an "invalid port"); the password must still not
// appear in the error.
func TestLoadErrorHidesUnencodedPassword(t *testing.T) {
	const pw = "s3cr3tPW"
	tests := []struct{ name, key, value string }{
		{"redis slash", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "/x@host:6379/0"},
		{"redis hash", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "#x@host:6379/0"},
		{"redis question mark", "DISPATCHER_REDIS_URL", "redis://user:" + pw + "?x@host:6379/0"},
		{"redis space", "DISPATCHER_REDIS_URL", "redis://user:" + pw + " x@host:6379/0"},
		{"redis quote", "DISPATCHER_REDIS_URL", "redis://user:" + pw + `"x@host:6379/0`},
		{"amqp slash", "DISPATCHER_AMQP_URL", "amqp://user:" + pw + "/x@host:5672/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, with(map[string]string{tt.key: tt.value}))
			_, err := config.Load()
			if err == nil {
				t.Fatalf("%s=%q: Load succeeded, want an error", tt.key, tt.value)
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error text reveals the password: %v", err)
			}
		})
	}
}

// Reasons that come from URL parsers may quote decoded parts of the URL;
// the error must still be one line.
func TestLoadErrorSingleLineForURLReasons(t *testing.T) {
	tests := []struct{ name, key, value string }{
		{"newline in redis path", "DISPATCHER_REDIS_URL", "redis://localhost:6379/0/%0Ainjected"},
		{"newline in redis option", "DISPATCHER_REDIS_URL", "redis://localhost:6379/0?a%0Ainjected=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, with(map[string]string{tt.key: tt.value}))
			_, err := config.Load()
			if err == nil {
				t.Fatalf("%s=%q: Load succeeded, want an error", tt.key, tt.value)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	e := &config.Error{Var: "DISPATCHER_AMQP_URL", Value: "amqp://u:s3cr3tPW@h:5672/", Reason: `dial amqp://u:s3cr3tPW@h:5672/: refused`}
	text := e.Error()
	if strings.Contains(text, "s3cr3tPW") {
		t.Errorf("Error() reveals the password: %s", text)
	}
	if !strings.HasPrefix(text, "DISPATCHER_AMQP_URL=") {
		t.Errorf("Error() = %q, want it to start with the variable", text)
	}
	e = &config.Error{Var: "DISPATCHER_QUEUES", Value: "a\nb", Reason: "bad"}
	if strings.Contains(e.Error(), "\n") {
		t.Errorf("Error() = %q spans several lines", e.Error())
	}
}

func TestUsage(t *testing.T) {
	var buf bytes.Buffer
	config.Usage(&buf)
	out := buf.String()
	for _, v := range []string{
		"DISPATCHER_REDIS_URL", "DISPATCHER_AMQP_URL", "DISPATCHER_KEY_PREFIX", "DISPATCHER_QUEUES",
		"DISPATCHER_LEASE", "DISPATCHER_HTTP_ADDR", "DISPATCHER_BATCH_SIZE", "DISPATCHER_PIPELINE",
		"DISPATCHER_POLL_INTERVAL", "DISPATCHER_IDLE_POLL_INTERVAL", "DISPATCHER_CONFIRM_TIMEOUT", "DISPATCHER_SHUTDOWN_TIMEOUT",
		"DISPATCHER_STAMP_PUBLISHED", "DISPATCHER_MAX_MESSAGE_BYTES", "DISPATCHER_MAX_ATTEMPTS", "DISPATCHER_RETRY_MIN",
		"DISPATCHER_RETRY_MAX", "DISPATCHER_LOG_LEVEL", "DISPATCHER_LOG_FORMAT", "DISPATCHER_STATS_INTERVAL", "DISPATCHER_STALL_AFTER",
		"DISPATCHER_QUEUE_<NAME>_SHARDS", "DISPATCHER_QUEUE_<NAME>_EXCHANGE", "DISPATCHER_QUEUE_<NAME>_ROUTING_KEY",
	} {
		if !strings.Contains(out, v+" ") {
			t.Errorf("Usage does not list %s", v)
		}
	}
	if strings.Contains(out, "guest:guest") {
		t.Errorf("Usage shows the default AMQP password:\n%s", out)
	}
	for _, d := range []string{"redis://localhost:6379/0", "30s", "50ms", "16777216"} {
		if !strings.Contains(out, d) {
			t.Errorf("Usage does not show the default %q", d)
		}
	}
}

// Every DISPATCHER_* variable Usage lists is one Load accepts (is not
// reported as unknown), and vice versa for the ones the contract names.
func TestUsageVariablesAreKnown(t *testing.T) {
	var buf bytes.Buffer
	config.Usage(&buf)
	for _, line := range strings.Split(buf.String(), "\n") {
		// A variable starts its line; indented lines are descriptions,
		// which may also start with a variable's name.
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(line, "DISPATCHER_") {
			continue
		}
		key := strings.ReplaceAll(f[0], "<NAME>", "ORDERS")
		t.Run(key, func(t *testing.T) {
			env := base()
			if _, ok := env[key]; !ok {
				env[key] = "x" // a value that may be invalid, but the variable must be known
			}
			setEnv(t, env)
			_, err := config.Load()
			var ce *config.Error
			if errors.As(err, &ce) && strings.Contains(ce.Reason, "unknown variable") {
				t.Errorf("Usage lists %s but Load reports it unknown: %v", key, err)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"orders", "ORDERS"},
		{"ORDERS", "ORDERS"},
		{"Orders", "ORDERS"},
		{"mail.out-2", "MAIL_OUT_2"},
		{"a.b", "A_B"},
		{"a_b", "A_B"},
		{"a-b", "A_B"},
		{"A_Z.0-9", "A_Z_0_9"},
		{"0123456789", "0123456789"},
		{"...", "___"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := config.EnvName(tt.in); got != tt.want {
			t.Errorf("EnvName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got, want := config.QueuePrefix("mail.out-2"), "DISPATCHER_QUEUE_MAIL_OUT_2"; got != want {
		t.Errorf("QueuePrefix = %q, want %q", got, want)
	}
}

func FuzzLoad(f *testing.F) {
	clearEnv(f)
	f.Add("orders", "16", "ex")
	f.Add("mail.out-2, orders", "4096", "")
	f.Add("a.b,a_b", "0", "ex")
	f.Add("or ders\n", "x\n", "e\nx")
	f.Add("задача,", "-1", strings.Repeat("e", 300))
	f.Fuzz(func(t *testing.T, queues, shards, exchange string) {
		if strings.ContainsRune(queues+shards+exchange, 0) {
			t.Skip("the environment cannot hold NUL")
		}
		t.Setenv("DISPATCHER_QUEUES", queues)
		for _, name := range strings.Split(queues, ",") {
			p := config.QueuePrefix(strings.TrimSpace(name))
			t.Setenv(p+"_SHARDS", shards)
			t.Setenv(p+"_EXCHANGE", exchange)
		}
		s, err := config.Load()
		if err != nil {
			if s != nil {
				t.Errorf("Load returned settings along with error %v", err)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Errorf("error spans several lines: %q", err)
			}
			return
		}
		if len(s.QueueSettings) != len(s.Queues) || len(s.Queues) == 0 {
			t.Fatalf("Queues %q but QueueSettings %+v", s.Queues, s.QueueSettings)
		}
		for _, q := range s.QueueSettings {
			if !shard.ValidQueueName(q.Name) || q.Shards < 1 || q.Shards > shard.MaxShards || q.RoutingKey == "" {
				t.Errorf("Load accepted bad queue settings %+v", q)
			}
		}
	})
}

// TestUnknownVariableSaysWhy: an unknown variable is answered with the
// known one it is a slip of, and a queue's variable with the queue not
// served says so in those words.
func TestUnknownVariableSaysWhy(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"swapped letters", with(map[string]string{"DISPATCHER_LEAES": "5m"}),
			`DISPATCHER_LEAES="5m": unknown variable; did you mean DISPATCHER_LEASE?`},
		{"missing underscore", with(map[string]string{"DISPATCHER_BATCHSIZE": "5"}),
			`DISPATCHER_BATCHSIZE="5": unknown variable; did you mean DISPATCHER_BATCH_SIZE?`},
		{"per-queue slip", with(map[string]string{"DISPATCHER_QUEUE_ORDERS_SHARD": "4"}),
			`unknown variable; did you mean DISPATCHER_QUEUE_ORDERS_SHARDS?`},
		{"queue not served", with(map[string]string{"DISPATCHER_QUEUE_FOO_SHARDS": "4"}),
			`DISPATCHER_QUEUE_FOO_SHARDS="4": DISPATCHER_QUEUE_FOO_SHARDS is set but FOO is not in DISPATCHER_QUEUES (orders)`},
		{"queue misspelt", with(map[string]string{"DISPATCHER_QUEUE_ORDER_MAX_RATE": "5"}),
			`DISPATCHER_QUEUE_ORDER_MAX_RATE is set but ORDER is not in DISPATCHER_QUEUES (orders); did you mean DISPATCHER_QUEUE_ORDERS_MAX_RATE?`},
		{"nothing near", with(map[string]string{"DISPATCHER_COLOUR": "blue"}),
			`DISPATCHER_COLOUR="blue": unknown variable (misspelt, or a queue missing from DISPATCHER_QUEUES?)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			_, err := config.Load()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load() error %v, want it to say %q", err, tt.want)
			}
		})
	}
	// A command's queue not in DISPATCHER_QUEUES, which is not set.
	setEnv(t, map[string]string{"DISPATCHER_QUEUE_MAIL_EXCHANGE": "x"})
	if _, err := config.LoadTool("orders"); err == nil || !strings.Contains(err.Error(), "DISPATCHER_QUEUE_MAIL_EXCHANGE is set but MAIL is not in DISPATCHER_QUEUES (not set)") {
		t.Errorf("LoadTool error %v", err)
	}
}
