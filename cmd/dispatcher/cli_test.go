package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// cliEnv clears the DISPATCHER_* settings of the environment for the
// test and sets the test Redis, under a prefix of the test's own, plus
// env; it returns the prefix and a Redis client.
func cliEnv(t *testing.T, env map[string]string) (string, *redis.Client) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "DISPATCHER_") && !strings.HasPrefix(k, "DISPATCHER_TEST_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	prefix := testenv.Name(t)
	rdb := testenv.Redis(t)
	testenv.CleanRedis(t, rdb, prefix)
	t.Setenv("DISPATCHER_REDIS_URL", testenv.RedisURL(t))
	t.Setenv("DISPATCHER_KEY_PREFIX", prefix)
	for k, v := range env {
		t.Setenv(k, v)
	}
	return prefix, rdb
}

// runCLI runs dispatcher in-process with args.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// recordShards records m as queue's shard count, as a dispatcher does.
func recordShards(t *testing.T, rdb *redis.Client, prefix, queue string, m int) {
	t.Helper()
	if err := rdb.Set(context.Background(), shard.Keys{Prefix: prefix, Queue: queue}.ShardCount(), m, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// dueOf is a pending member's due time, or 0.
func dueOf(t *testing.T, rdb *redis.Client, prefix, queue string, m int, member string) time.Time {
	t.Helper()
	k := shard.Keys{Prefix: prefix, Queue: queue}
	s, err := rdb.ZScore(context.Background(), k.Shard([]byte(member), m), member).Result()
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(int64(s))
}

// Issue 22 item 4: with only a Redis URL, the commands take the shard
// count Redis records; a configured one must agree with it.
func TestCommandsNeedOnlyRedisURL(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "jobs", 8)

	out, errOut, code := runCLI(t, "schedule", "--queue", "jobs", "--in", "1h", "hello")
	if code != exitOK || !strings.Contains(out, "scheduled on jobs shard") {
		t.Fatalf("schedule with only DISPATCHER_REDIS_URL: exit %d, %q %q", code, out, errOut)
	}
	if dueOf(t, rdb, prefix, "jobs", 8, "hello").IsZero() {
		t.Error("not pending on the shard of the recorded count 8")
	}
	out, errOut, code = runCLI(t, "stats", "--queue", "jobs", "--json")
	if code != exitOK || strings.Count(out, `"shard":`) != 8 || !strings.Contains(out, `"pending": 1`) {
		t.Errorf("stats --queue jobs: exit %d, %q\n%s", code, errOut, out)
	}
	// Without --queue nor DISPATCHER_QUEUES: the queues Redis records.
	if out, errOut, code = runCLI(t, "stats"); code != exitOK || !strings.Contains(out, "jobs") {
		t.Errorf("stats: exit %d, %q\n%s", code, errOut, out)
	}
	if _, errOut, code = runCLI(t, "cancel", "--queue", "jobs", "hello"); code != exitOK {
		t.Errorf("cancel: exit %d, %q", code, errOut)
	}

	// A count of its own that differs: Redis is the truth, with a warning
	// naming both.
	t.Setenv("DISPATCHER_QUEUE_JOBS_SHARDS", "16")
	out, errOut, code = runCLI(t, "schedule", "--queue", "jobs", "--in", "1h", "y")
	if code != exitOK || !strings.Contains(errOut, "DISPATCHER_QUEUE_JOBS_SHARDS=16, but queue jobs has 8 shards recorded") ||
		!strings.Contains(out, "shard "+strconv.Itoa(shard.Index([]byte("y"), 8))+",") {
		t.Errorf("schedule with SHARDS=16, 8 recorded: exit %d, %q, %q", code, errOut, out)
	}
	t.Setenv("DISPATCHER_QUEUE_JOBS_SHARDS", "8")
	if _, errOut, code = runCLI(t, "schedule", "--queue", "jobs", "--in", "1h", "x"); code != exitOK {
		t.Errorf("schedule with SHARDS=8, 8 recorded: exit %d, %q", code, errOut)
	}

	// Neither recorded nor configured: says what to do.
	os.Unsetenv("DISPATCHER_QUEUE_JOBS_SHARDS")
	_, errOut, code = runCLI(t, "schedule", "--queue", "nobody", "--in", "1h", "x")
	if code != exitSettings || !strings.Contains(errOut, "no shard count recorded") || !strings.Contains(errOut, "DISPATCHER_QUEUE_NOBODY_SHARDS") {
		t.Errorf("schedule on a queue nobody recorded: exit %d, %q", code, errOut)
	}
}

// Issue 22 item 7: stats checks the shard count: it shows the shards
// recorded in Redis (the truth once recorded), not a part of them, and
// warns that the configured count differs.
func TestStatsChecksShardCount(t *testing.T) {
	prefix, rdb := cliEnv(t, map[string]string{
		"DISPATCHER_QUEUES": "st", "DISPATCHER_QUEUE_ST_SHARDS": "8", "DISPATCHER_QUEUE_ST_EXCHANGE": "tasks",
	})
	recordShards(t, rdb, prefix, "st", 16)
	for _, args := range [][]string{{"stats"}, {"stats", "--json"}, {"stats", "--queue", "st"}, {"stats", "--shards"}} {
		out, errOut, code := runCLI(t, args...)
		if code != exitOK || !strings.Contains(errOut, "DISPATCHER_QUEUE_ST_SHARDS=8, but queue st has 16 shards recorded") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("dispatcher %s with 8 configured, 16 recorded: exit %d, stderr %q, stdout:\n%s", strings.Join(args, " "), code, errOut, out)
		}
		// Every shard (with --shards: more than 8 shards make a summary
		// by default), or the queue's row saying 16 shards.
		rows := regexp.MustCompile(`(?m)^\s*st\s+(all|\d+)\s`).FindAllStringSubmatch(out, -1)
		if args[len(args)-1] == "--shards" && len(rows) != 17 { // the sum and 16 shards
			t.Errorf("stats --shards shows %d lines of queue st, want 17:\n%s", len(rows), out)
		}
		if len(args) == 1 && (len(rows) != 1 || rows[0][1] != "16") {
			t.Errorf("stats shows %d lines of queue st, want its summary of 16 shards:\n%s", len(rows), out)
		}
	}
}

// Issue 22 item 8: flags after the body, a due time in the past, and a
// body from stdin cancelled the way it was scheduled.
func TestScheduleArguments(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 4)

	// Flags after the body, as most CLIs take them.
	before := time.Now()
	_, errOut, code := runCLI(t, "schedule", "--queue", "q", "after", "--in", "1m")
	if code != exitOK {
		t.Fatalf("schedule --queue q after --in 1m: exit %d, %q", code, errOut)
	}
	if due := dueOf(t, rdb, prefix, "q", 4, "after"); due.Sub(before) < 59*time.Second || due.Sub(before) > 61*time.Second {
		t.Errorf("due %v, want a minute after %v", due, before)
	}

	// A due time in the past needs --past.
	for _, args := range [][]string{
		{"schedule", "--queue", "q", "--in", "-5m", "past-in"},
		{"schedule", "--queue", "q", "--at", "2020-01-01T00:00:00Z", "past-at"},
	} {
		_, errOut, code := runCLI(t, args...)
		if code != exitSettings || !strings.Contains(errOut, "--past") {
			t.Errorf("dispatcher %s: exit %d, %q; want 2 asking for --past", strings.Join(args, " "), code, errOut)
		}
		if !dueOf(t, rdb, prefix, "q", 4, args[len(args)-1]).IsZero() {
			t.Errorf("dispatcher %s scheduled the task", strings.Join(args, " "))
		}
	}
	if _, errOut, code := runCLI(t, "schedule", "--queue", "q", "--in", "-5m", "--past", "past-ok"); code != exitOK {
		t.Errorf("--in -5m --past: exit %d, %q", code, errOut)
	}

	// A body from stdin loses the newline echo added, and cancel reads
	// it the same way.
	var out, errBuf bytes.Buffer
	if code := runWith([]string{"schedule", "--queue", "q", "--in", "1h", "-"}, strings.NewReader("from stdin\n"), &out, &errBuf); code != exitOK {
		t.Fatalf("schedule -: exit %d, %q", code, errBuf.String())
	}
	if dueOf(t, rdb, prefix, "q", 4, "from stdin").IsZero() {
		t.Error(`"from stdin" is not pending (trailing newline kept?)`)
	}
	errBuf.Reset()
	if code := runWith([]string{"cancel", "--queue", "q", "-"}, strings.NewReader("from stdin\n"), &out, &errBuf); code != exitOK {
		t.Errorf("cancel -: exit %d, %q", code, errBuf.String())
	}
	// --raw keeps the bytes.
	if code := runWith([]string{"schedule", "--queue", "q", "--in", "1h", "--raw", "-"}, strings.NewReader("raw\n"), &out, &errBuf); code != exitOK ||
		dueOf(t, rdb, prefix, "q", 4, "raw\n").IsZero() {
		t.Errorf("schedule --raw -: exit %d, %q; want the body with its newline", code, errBuf.String())
	}
}

// Issue 22 item 5: --version, and help that fits an 80-column terminal
// and says what DISPATCHER_HTTP_ADDR serves.
func TestVersionAndHelp(t *testing.T) {
	out, _, code := runCLI(t, "--version")
	if code != exitOK || !strings.HasPrefix(out, "dispatcher ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("--version: exit %d, %q", code, out)
	}
	help := func(args ...string) string {
		t.Helper()
		out, errOut, code := runCLI(t, append(args, "--help")...)
		if code != exitOK || errOut != "" {
			t.Errorf("dispatcher %s --help: exit %d, %q", strings.Join(args, " "), code, errOut)
		}
		for _, l := range strings.Split(out, "\n") {
			if len([]rune(l)) > 80 {
				t.Errorf("dispatcher %s --help: a line of %d columns: %q", strings.Join(args, " "), len([]rune(l)), l)
			}
		}
		return out
	}
	root := help()
	if i := strings.Index(root, "DISPATCHER_HTTP_ADDR"); i < 0 || !strings.Contains(root[i:i+200], "status page") {
		t.Error("--help does not say DISPATCHER_HTTP_ADDR serves the status page")
	}
	// Every command's help, as registered.
	for _, c := range newRootCmd(streams{}).Commands() {
		if c.Name() == "bench" { // its own flags, Go flag style; help on stderr
			_, errOut, code := runCLI(t, "bench", "-h")
			for _, l := range strings.Split(errOut, "\n") {
				if code != exitOK || len([]rune(l)) > 80 {
					t.Errorf("dispatcher bench -h: exit %d, a line of %d columns: %q", code, len([]rune(l)), l)
				}
			}
			continue
		}
		help(c.Name())
		for _, sub := range c.Commands() {
			help(c.Name(), sub.Name())
		}
	}
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// binary builds dispatcher once, with its version set at link time.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dispatcher-cli-test")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "dispatcher")
		out, err := exec.Command("go", "build", "-ldflags", "-X main.buildVersion=v9.8.7-test", "-o", built, ".").CombinedOutput()
		if err != nil {
			buildErr = err
			built = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build: %v\n%s", buildErr, built)
	}
	return built
}

// Issue 22 items 5 and 6: the version given at link time; and a command
// on a Redis that cannot be reached says so in one line, without
// go-redis's own log lines.
func TestBinaryVersionAndOneLineErrors(t *testing.T) {
	bin := binary(t)
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "dispatcher v9.8.7-test") {
		t.Errorf("--version of a build with -X main.buildVersion: %v %q", err, out)
	}
	unreachable := "redis://" + testenv.FreeAddr(t) + "/0"
	for _, args := range [][]string{
		{"stats", "--queue", "q"},
		{"stats"},
		{"schedule", "--queue", "q", "--in", "1m", "x"},
		{"pause", "--queue", "q"},
		{"bench", "-redis", unreachable, "-mode", "rate", "-rate", "100", "-duration", "2s"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DISPATCHER_REDIS_URL=" + unreachable,
			"DISPATCHER_QUEUES=q", "DISPATCHER_QUEUE_Q_SHARDS=8", "DISPATCHER_QUEUE_Q_EXCHANGE=tasks"}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != exitFailure || strings.Count(stderr.String(), "\n") != 1 || !strings.HasPrefix(stderr.String(), "dispatcher "+args[0]+": ") {
			t.Errorf("dispatcher %s on an unreachable Redis: exit %d, stderr:\n%s\nwant 1 and exactly one line", strings.Join(args, " "), code, stderr.String())
		}
	}
	if !t.Failed() {
		os.RemoveAll(filepath.Dir(bin))
	}
}

// Issue 22 item 6, the daemon: go-redis's dial failures do not repeat, at
// info level, the error the daemon logs itself ("waiting for Redis");
// its other messages still show.
func TestRedisLoggerLeavesDialFailuresToTheCaller(t *testing.T) {
	var buf bytes.Buffer
	l := newRedisLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	ctx := context.Background()
	l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
	if buf.Len() != 0 {
		t.Errorf("a dial failure logged at info level: %s", buf.String())
	}
	l.Printf(ctx, "redis: discarding bad PubSub connection: %v", errors.New("EOF"))
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "PubSub") {
		t.Errorf("other go-redis messages no longer logged: %q", buf.String())
	}
}

// lockedBuffer is a bytes.Buffer safe to read while a command writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Issue 22 item 4, seeing a task arrive: tail prints what reaches the
// queue's exchange and routing key, takes nothing from a consumer's
// queue, and says what is wrong when the exchange is missing.
func TestTail(t *testing.T) {
	cliEnv(t, map[string]string{"DISPATCHER_AMQP_URL": testenv.AMQPURL(t)})
	exchange := testenv.Name(t)
	conn := testenv.AMQP(t)
	consumer := testenv.Consumer(t, conn, exchange, "jobs") // declares the exchange

	if _, errOut, code := runCLI(t, "tail", "--queue", "jobs"); code != exitSettings || !strings.Contains(errOut, "--exchange") {
		t.Errorf("tail without an exchange: exit %d, %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, "tail", "--queue", "jobs", "--exchange", exchange+"-missing"); code != exitFailure || !strings.Contains(errOut, "does not exist") {
		t.Errorf("tail on a missing exchange: exit %d, %q", code, errOut)
	}

	var out, errOut lockedBuffer
	done := make(chan int)
	go func() {
		done <- runWith([]string{"tail", "--queue", "jobs", "--exchange", exchange, "--count", "1", "--timeout", "20s", "--json"}, nil, &out, &errOut)
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(errOut.String(), "waiting for tasks"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tail did not bind: %q", errOut.String())
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	due := time.Now().UnixMilli()
	if err := ch.Publish(exchange, "jobs", false, false, amqp.Publishing{MessageId: "abc-1", Body: []byte("hi"),
		Headers: amqp.Table{"x-due-ms": due}}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != exitOK || !strings.Contains(out.String(), `"message_id":"abc-1"`) || !strings.Contains(out.String(), `"body":"hi"`) ||
			!strings.Contains(out.String(), fmt.Sprintf(`"due_ms":%d`, due)) {
			t.Errorf("tail --count 1: exit %d, %q %q", code, out.String(), errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("tail did not stop after --count 1")
	}
	select {
	case d := <-consumer:
		if d.MessageId != "abc-1" {
			t.Errorf("the consumer got %q", d.MessageId)
		}
	case <-time.After(5 * time.Second):
		t.Error("the consumer's queue lost the task to tail")
	}
	// --timeout before --count: exit 1.
	if _, errOut, code := runCLI(t, "tail", "--queue", "jobs", "--exchange", exchange, "--count", "1", "--timeout", "300ms"); code != exitFailure || !strings.Contains(errOut, "0 of 1 tasks arrived") {
		t.Errorf("tail timing out: exit %d, %q", code, errOut)
	}
}

func TestParseTime(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"now", 1_800_000_000_000},
		{"1767225600000", 1_767_225_600_000},
		{"2026-01-01T00:00:00Z", 1_767_225_600_000},
		{"2026-01-01T01:00:00+01:00", 1_767_225_600_000},
		{"90s", 1_800_000_090_000},
		{"+2h", 1_800_007_200_000},
		{"-10m", 1_799_999_400_000},
	} {
		got, err := parseTime("from", c.in, now)
		if err != nil || got != c.want {
			t.Errorf("parseTime(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "tomorrow", "2026-13-01", "10 minutes"} {
		if _, err := parseTime("to", bad, now); err == nil || !strings.Contains(err.Error(), "--to") {
			t.Errorf("parseTime(%q) = %v; want an error naming --to", bad, err)
		}
	}
}
