package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestWrongTypeShardDoesNotStopOthers puts a string where shard 2's sorted
// set should be: that shard's error is logged (rate-limited) and counted,
// every other shard keeps flowing, and the process stays up.
func TestWrongTypeShardDoesNotStopOthers(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "wt", Shards: 4})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	k := shard.Keys{Prefix: h.prefix, Queue: "wt"}
	if err := h.rdb.Set(context.Background(), k.Pending(2), "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := h.start()
	// Tasks for the healthy shards only (shard 2 cannot hold any).
	prod := h.producer("wt")
	var tasks []shard.Task
	want := map[string]int64{}
	due := time.Now().Add(300 * time.Millisecond)
	for i := 0; len(tasks) < 300; i++ {
		m := []byte(fmt.Sprint("wt-", i))
		if shard.Index(m, 4) == 2 {
			continue
		}
		tasks = append(tasks, shard.Task{Member: m, Due: due})
		want[shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
	}
	if err := prod.ScheduleMany(context.Background(), tasks); err != nil {
		t.Fatal(err)
	}
	h.verify("wt", want, 20*time.Second, 0)
	time.Sleep(1500 * time.Millisecond) // many scan loops over the bad shard
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
	logged := strings.Count(p.out.String(), "shard unusable")
	if logged == 0 || logged > 3 {
		t.Fatalf("bad shard logged %d times; want it logged, but rate-limited", logged)
	}
	if !strings.Contains(p.out.String(), k.Pending(2)) {
		t.Fatal("log does not name the bad key")
	}
	metrics := get(t, "http://"+addr+"/metrics")
	if !regexp.MustCompile(`dispatcher_errors_total\{kind="wrongtype",queue="wt"\} [1-9]`).MatchString(metrics) {
		t.Fatalf("wrongtype errors not counted:\n%s", grep(metrics, "dispatcher_errors_total"))
	}
	if body := get(t, "http://"+addr+"/readyz"); !strings.Contains(body, "ready") {
		t.Fatalf("readyz: %q", body)
	}
}

// get returns the body of a GET, whatever its status.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grep(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestOversizeMemberDeadLettered: a member over DISPATCHER_MAX_MESSAGE_BYTES
// goes to the shard's dead-letter set with its reason and does not hold up
// the tasks around it.
func TestOversizeMemberDeadLettered(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "big", Shards: 1})
	h.extra["DISPATCHER_MAX_MESSAGE_BYTES"] = "1000"
	h.start()
	prod := h.producer("big")
	due := time.Now().Add(300 * time.Millisecond)
	big := bytes.Repeat([]byte("x"), 2000)
	if err := prod.Schedule(context.Background(), big, due); err != nil {
		t.Fatal(err)
	}
	want := scheduleSpread(t, prod, "small", 50, due, 10*time.Millisecond)
	// verify also fails if the big member arrives: it is not in want.
	h.verify("big", want, 15*time.Second, 0)
	k := shard.Keys{Prefix: h.prefix, Queue: "big"}
	eventually(t, 5*time.Second, "big member in the dead-letter set", func() bool {
		return h.rdb.ZScore(context.Background(), k.Dead(0), deadEntry(big, due)).Val() == float64(due.UnixMilli())
	})
	reason := h.rdb.HGet(context.Background(), k.DeadReason(0), deadEntry(big, due)).Val()
	if !strings.Contains(reason, "2000 bytes") || !strings.Contains(reason, "DISPATCHER_MAX_MESSAGE_BYTES=1000") {
		t.Fatalf("reason %q", reason)
	}
	if p, f, _ := h.leftovers(h.queues[0]); p+f != 0 {
		t.Fatalf("%d pending, %d in flight left", p, f)
	}
}

// TestBrokerRefusedMemberDeadLettered lowers the broker's max_message_size
// (restored afterwards): the broker closes the channel on the big member,
// its batch-mates are published alone and go through, and the big member
// reaches the dead-letter set after DISPATCHER_MAX_ATTEMPTS tries.
func TestBrokerRefusedMemberDeadLettered(t *testing.T) {
	if err := exec.Command("rabbitmqctl", "-q", "eval", "application:set_env(rabbit, max_message_size, 1048576).").Run(); err != nil {
		t.Skipf("cannot set the broker's max_message_size: %v", err)
	}
	t.Cleanup(func() {
		_ = exec.Command("rabbitmqctl", "-q", "eval", "application:set_env(rabbit, max_message_size, 134217728).").Run()
	})
	h := newHarness(t, queueSpec{Name: "refused", Shards: 1})
	h.extra["DISPATCHER_MAX_ATTEMPTS"] = "2"
	h.extra["DISPATCHER_RETRY_MIN"] = "200ms"
	p := h.start()
	prod := h.producer("refused")
	due := time.Now().Add(500 * time.Millisecond)
	big := bytes.Repeat([]byte("y"), 1500000)
	want := scheduleSpread(t, prod, "a", 20, due.Add(-5*time.Millisecond), 5*time.Millisecond)
	if err := prod.Schedule(context.Background(), big, due); err != nil {
		t.Fatal(err)
	}
	for id, d := range scheduleSpread(t, prod, "b", 20, due, 5*time.Millisecond) {
		want[id] = d
	}
	// The broker closing the channel loses the confirms of the batch-mates
	// already on it, which then go out again: at most the 40 of them.
	h.verify("refused", want, 20*time.Second, len(want))
	k := shard.Keys{Prefix: h.prefix, Queue: "refused"}
	eventually(t, 20*time.Second, "refused member in the dead-letter set", func() bool {
		return h.rdb.ZCard(context.Background(), k.Dead(0)).Val() == 1
	})
	reason := h.rdb.HGet(context.Background(), k.DeadReason(0), deadEntry(big, due)).Val()
	if !strings.Contains(reason, "406") || !strings.Contains(reason, "after 2 attempts") {
		t.Fatalf("reason %q", reason)
	}
	// The log names the cause, for the retries before the dead letter.
	if l := grep(p.out.String(), "kind=refused"); !strings.Contains(l, `cause="refused as too large: 406 PRECONDITION_FAILED`) ||
		!strings.Contains(l, "routing_key=refused") {
		t.Errorf("the log does not name the refusal as too large, with the routing key:\n%s", l)
	}
	if n := h.rdb.Exists(context.Background(), k.Retrying(0), k.Attempts(0)).Val(); n != 0 {
		t.Errorf("%d of the retrying index and the attempts hash left after every task was delivered or dead", n)
	}
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
}

// TestUnroutableRetriedUntilBound: with no queue bound, the broker returns
// the mandatory messages; they are kept and retried with backoff (never
// dropped or dead-lettered) and arrive once a queue is bound.
func TestUnroutableRetriedUntilBound(t *testing.T) {
	h := newHarness(t)
	h.queues = []queueSpec{{Name: "noroute", Shards: 2, Exchange: h.prefix + ".noroute", RoutingKey: "noroute"}}
	h.extra["DISPATCHER_RETRY_MIN"] = "100ms"
	h.extra["DISPATCHER_RETRY_MAX"] = "400ms"
	p := h.start()
	want := scheduleSpread(t, h.producer("noroute"), "n", 100, time.Now().Add(200*time.Millisecond), 100*time.Millisecond)
	eventually(t, 10*time.Second, "returned messages logged", func() bool {
		return strings.Contains(p.out.String(), "kind=returned")
	})
	time.Sleep(time.Second)
	if _, _, d := h.leftovers(h.queues[0]); d != 0 {
		t.Fatalf("%d unroutable tasks dead-lettered", d)
	}
	h.got["noroute"] = testenv.Consumer(t, h.conn, h.queues[0].Exchange, "noroute")
	// A returned message reached no queue, so its retry is no duplicate.
	h.verify("noroute", want, 20*time.Second, 0)
}

// TestBadSettingsExitBeforeConnecting: bad settings exit 2 at once, before
// any connection (Redis points at a closed port), with one line naming the
// variable and the value, and never show a password.
func TestBadSettingsExitBeforeConnecting(t *testing.T) {
	base := map[string]string{
		"DISPATCHER_REDIS_URL":             "redis://:s3cr3tPW@127.0.0.1:1/0",
		"DISPATCHER_AMQP_URL":              "amqp://u:s3cr3tPW@127.0.0.1:1/",
		"DISPATCHER_QUEUES":                "orders",
		"DISPATCHER_QUEUE_ORDERS_SHARDS":   "8",
		"DISPATCHER_QUEUE_ORDERS_EXCHANGE": "ex",
	}
	cases := []struct{ key, value, want string }{
		{"DISPATCHER_QUEUES", "or ders", `DISPATCHER_QUEUES="or ders"`},
		{"DISPATCHER_QUEUE_ORDERS_SHARDS", "0", `DISPATCHER_QUEUE_ORDERS_SHARDS="0"`},
		{"DISPATCHER_QUEUE_ORDERS_SHARDS", "5000", `DISPATCHER_QUEUE_ORDERS_SHARDS="5000"`},
		{"DISPATCHER_REDIS_URL", "redis://:s3cr3tPW@127.0.0.1:notaport/0", `DISPATCHER_REDIS_URL=`},
		{"DISPATCHER_AMQP_URL", "http://u:s3cr3tPW@host/", `DISPATCHER_AMQP_URL=`},
		{"DISPATCHER_REDIS_URL", "redis+sentinel://:s3cr3tPW@127.0.0.1:1?addr=127.0.0.1:2", `DISPATCHER_REDIS_URL="redis+sentinel://:xxxxx@127.0.0.1:1?addr=127.0.0.1:2": master_name= is required`},
		{"DISPATCHER_REDIS_URL", "redis+sentinel://127.0.0.1:1?master_name=m&password=s3cr3tPW&bogus=1", `password=xxxxx`},
		{"DISPATCHER_REDIS_URL", "redis+cluster://u:s3cr3tPW@127.0.0.1:1?addr=nohostport", `DISPATCHER_REDIS_URL="redis+cluster://u:xxxxx@127.0.0.1:1?addr=nohostport"`},
		{"DISPATCHER_REDIS_URL", "redis+shards://u:s3cr3tPW@127.0.0.1:1", `scheme "redis+shards": want redis://`},
		{"DISPATCHER_LEASE", "-5s", `DISPATCHER_LEASE="-5s"`},
		{"DISPATCHER_POLL_INTERVAL", "soon", `DISPATCHER_POLL_INTERVAL="soon"`},
		{"DISPATCHER_LAESE", "30s", `DISPATCHER_LAESE="30s"`},
		{"DISPATCHER_HTTP_ADDR", "localhost", `DISPATCHER_HTTP_ADDR="localhost"`},
		{"DISPATCHER_HTTP_ADDR", "127.0.0.1:99999", `DISPATCHER_HTTP_ADDR="127.0.0.1:99999"`},
	}
	for _, c := range cases {
		t.Run(c.key+"="+c.value, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			env[c.key] = c.value
			p := start(t, env)
			code := p.wait(5 * time.Second)
			out := strings.TrimSpace(p.out.String())
			if code != 2 {
				t.Fatalf("exit code %d, want 2; output %q", code, out)
			}
			if strings.Count(out, "\n") != 0 || !strings.Contains(out, c.want) {
				t.Fatalf("output %q: want one line containing %q", out, c.want)
			}
			if strings.Contains(out, "s3cr3tPW") {
				t.Fatalf("password in output: %q", out)
			}
		})
	}
}

// TestPasswordsNeverLogged runs with a wrong broker password and a Redis
// password the server does not expect: the logs (and, for Redis, the one
// line before exit code 2) tell what is wrong without showing either
// password.
func TestPasswordsNeverLogged(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "pw", Shards: 1})
	env := h.env()
	env["DISPATCHER_AMQP_URL"] = "amqp://guest:WrongPW-s3cr3t@" + testenv.HostPort(testenv.AMQPURL(t)) + "/"
	p := start(t, env)
	eventually(t, 10*time.Second, "broker connect failure logged", func() bool {
		return strings.Contains(p.out.String(), "broker connect failed")
	})
	env = h.env()
	env["DISPATCHER_REDIS_URL"] = "redis://nobody:RedisPW-s3cr3t@" + testenv.HostPort(testenv.RedisURL(t)) + "/0"
	p2 := start(t, env)
	if code := p2.wait(10 * time.Second); code != 2 || !strings.Contains(p2.out.String(), "WRONGPASS") {
		t.Errorf("wrong Redis password: exit %d, output %q; want 2 and WRONGPASS", code, p2.out.String())
	}
	for _, out := range []string{p.out.String(), p2.out.String()} {
		if strings.Contains(out, "s3cr3t") {
			t.Fatalf("password in log:\n%s", out)
		}
	}
}

// TestShardCountGuard: the first instance records M; from then on Redis
// is the truth. A later deployment with another M serves the recorded one,
// warns naming the variable and the recorded layout, leaves the record
// alone, and dispatches every task scheduled with the recorded M.
func TestShardCountGuard(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "guard", Shards: 8})
	first := h.start()
	k := shard.Keys{Prefix: h.prefix, Queue: "guard"}
	eventually(t, 10*time.Second, "shard count recorded", func() bool {
		return h.rdb.Get(context.Background(), k.ShardCount()).Val() == "8"
	})
	first.signal(syscall.SIGTERM)
	if code := first.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	for n, wrong := range []int{16, 4} {
		want := scheduleSpread(t, h.producer("guard"), fmt.Sprintf("g%d", n), 500, time.Now(), 100*time.Millisecond)
		env := h.env()
		env["DISPATCHER_QUEUE_GUARD_SHARDS"] = strconv.Itoa(wrong)
		p := start(t, env)
		h.verify("guard", want, 20*time.Second, 0)
		out := p.out.String()
		for _, s := range []string{"serving the recorded one", `layout="8 shards"`,
			fmt.Sprintf("DISPATCHER_QUEUE_GUARD_SHARDS=%d", wrong)} {
			if !strings.Contains(out, s) {
				t.Fatalf("M=%d: output does not contain %q:\n%s", wrong, s, out)
			}
		}
		if got := h.rdb.Get(context.Background(), k.ShardCount()).Val(); got != "8" {
			t.Fatalf("M=%d: recorded shard count now %q", wrong, got)
		}
		p.signal(syscall.SIGTERM)
		p.wait(20 * time.Second)
	}
}

// deadEntry is how the dead-letter set names one scheduling: the in-flight
// entry "<due_ms>:<member>".
func deadEntry(member []byte, due time.Time) string {
	return strconv.FormatInt(due.UnixMilli(), 10) + ":" + string(member)
}
