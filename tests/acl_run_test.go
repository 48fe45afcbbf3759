package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestDocumentedACLWholeRun runs the dispatcher and the operator commands
// as a Redis user set up with exactly the command list docs/how-it-works.md
// gives (read from the file), on a private Redis, through every path that
// sends commands of its own: plain tasks, tasks with ids and properties,
// a recurring schedule added and removed from the CLI, a dead letter
// (over DISPATCHER_MAX_MESSAGE_BYTES) listed and purged, list, show and
// stats (also without DISPATCHER_QUEUES: every queue recorded). Every task arrives once, nothing is left in Redis, and Redis's
// ACL log shows nothing refused but the optional CONFIG GET: a command
// sent directly by the Go code, not only a script's call, that the list
// lacks fails this.
func TestDocumentedACLWholeRun(t *testing.T) {
	doc := documentedACL(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{MaxMemoryPolicy: "noeviction", Users: []string{"user default off"}})
	q := queueSpec{Name: "aclrun", Shards: 4}
	h := newHarnessOn(t, srv.Client(), q)
	ctx := context.Background()
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	password := "pw-" + hex.EncodeToString(b)
	rules := []any{"ACL", "SETUSER", "dispatcher", "reset", "on", ">" + password, "~" + h.prefix + ":*", "&" + h.prefix + ":*"}
	var cmds []string
	for c := range doc {
		cmds = append(cmds, c)
	}
	sort.Strings(cmds)
	for _, c := range cmds {
		rules = append(rules, "+"+c)
	}
	if err := h.rdb.Do(ctx, rules...).Err(); err != nil {
		t.Fatalf("ACL SETUSER with the documented list: %v", err)
	}
	if err := h.rdb.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	h.extra["DISPATCHER_REDIS_URL"] = srv.URLFor("dispatcher", password)
	h.extra["DISPATCHER_MAX_MESSAGE_BYTES"] = "100"
	h.extra["DISPATCHER_HTTP_ADDR"] = testenv.FreeAddr(t)
	// The AMQP ingress too: its batches read cancel marks (MGET).
	ingEx := h.prefix + ".ingress"
	h.extra[config.QueuePrefix(q.Name)+"_INGRESS_EXCHANGE"] = ingEx
	t.Cleanup(func() {
		if c, err := h.conn.Channel(); err == nil {
			_, _ = c.QueueDelete(ingress.QueueName(q.Name), false, false, false)
			_ = c.ExchangeDelete(ingEx, false, false)
			c.Close()
		}
	})
	p := h.start()
	waitStarted(t, p)
	cli := func(args ...string) string {
		t.Helper()
		out, errOut, code := runCLI(t, h.env(), args...)
		if code != 0 {
			t.Errorf("dispatcher %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}

	// Plain tasks and tasks with ids and properties, each once.
	due := h.redisNow().Add(2 * time.Second)
	want := scheduleSpread(t, h.producer(q.Name), "plain", 20, due, time.Second)
	var idTasks []shard.IDTask
	for i := range 20 {
		id := []byte(fmt.Sprintf("aclrun-id-%d", i))
		idTasks = append(idTasks, shard.IDTask{ID: id, Body: []byte("body"),
			Props: &shard.Properties{ContentType: "text/plain", Headers: map[string]any{"n": i}}, Due: due})
		want[shard.MessageID(id, due.UnixMilli())] = due.UnixMilli()
	}
	if err := h.producer(q.Name).ScheduleIDs(ctx, idTasks); err != nil {
		t.Fatal(err)
	}
	verifyWhile(h, q.Name, want, 30*time.Second, 0, func() {
		cli("show", "--queue", q.Name, "aclrun-id-3")
		cli("list", "--queue", q.Name)
		cli("stats", "--queue", q.Name)
	})
	// An operator's shell without the daemon's queue settings: stats finds
	// the queues recorded in Redis.
	bare := map[string]string{}
	for _, k := range []string{"DISPATCHER_REDIS_URL", "DISPATCHER_KEY_PREFIX"} {
		bare[k] = h.env()[k]
	}
	if out, errOut, code := runCLI(t, bare, "stats"); code != 0 || !strings.Contains(out, q.Name) {
		t.Errorf("dispatcher stats with no queue settings: exit %d, want 0 and a row of %s\n%s%s", code, q.Name, out, errOut)
	}

	// Messages to the ingress, as the delayed-message plugin's users send
	// them: each arrives once.
	pub, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ingWant := map[string]int64{}
	for i := range 5 {
		id := fmt.Sprintf("aclrun-ing-%d", i)
		if err := pub.PublishWithContext(ctx, ingEx, h.queues[0].RoutingKey, false, false, amqp.Publishing{
			MessageId: id, Body: []byte(id), Headers: amqp.Table{"x-delay": int32(500)}}); err != nil {
			t.Fatal(err)
		}
		ingWant[id] = 0
	}
	ingDeadline := time.After(20 * time.Second)
	for left := len(ingWant); left > 0; {
		select {
		case d := <-h.got[q.Name]:
			n, ok := ingWant[string(d.Body)]
			if !ok || n > 0 {
				t.Fatalf("unexpected delivery %q (delivered %d times before; ingress messages left: %d); output:\n%s", d.Body, n, left, tail(p.out.String(), 3000))
			}
			ingWant[string(d.Body)]++
			left--
		case <-ingDeadline:
			t.Fatalf("%d of the 5 ingress messages did not arrive within 20 s; output:\n%s", left, tail(p.out.String(), 3000))
		}
	}

	// A recurring schedule, added and removed from the CLI: an occurrence
	// arrives.
	cli("recurring", "add", "--queue", q.Name, "--name", "tick", "--cron", "@every 1s", "aclrun-tick")
	cli("recurring", "list", "--queue", q.Name)
	deadline := time.After(20 * time.Second)
wait:
	for {
		select {
		case d := <-h.got[q.Name]:
			if string(d.Body) == "aclrun-tick" {
				break wait
			}
			t.Errorf("unexpected delivery %q", d.Body)
		case <-deadline:
			t.Fatalf("no occurrence of the recurring schedule arrived; output:\n%s", tail(p.out.String(), 3000))
		}
	}
	cli("recurring", "remove", "--queue", q.Name, "--name", "tick")

	// A dead letter: over DISPATCHER_MAX_MESSAGE_BYTES.
	big := strings.Repeat("x", 200)
	i := shard.Index([]byte(big), q.Shards)
	if err := h.rdb.ZAdd(ctx, h.keys(q).Pending(i), redis.Z{Score: float64(h.redisNow().UnixMilli()), Member: big}).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the oversized task dead", func() bool {
		_, _, dead := h.leftovers(q)
		return dead == 1
	})
	cli("dead", "list", "--queue", q.Name)
	cli("dead", "purge", "--queue", q.Name, "--yes", "--all")

	// Occurrences fired before the removal may still come: drain them.
	time.Sleep(2 * time.Second)
	for len(h.got[q.Name]) > 0 {
		<-h.got[q.Name]
	}
	h.emptyAtEnd(q)
	p.signal(syscall.SIGTERM)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
	out := p.out.String()
	// The one error expected is the dead letter's.
	for _, l := range strings.Split(grep(out, "level=ERROR"), "\n") {
		if l != "" && !strings.Contains(l, "tasks moved to the dead-letter set") {
			t.Errorf("error logged: %s", l)
		}
	}
	if strings.Contains(out, password) {
		t.Errorf("the Redis password appears in the output")
	}
	entries, err := h.rdb.Do(ctx, "ACL", "LOG", "128").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if s := fmt.Sprint(e); !strings.Contains(s, "config|get") {
			t.Errorf("the documented ACL refused the dispatcher something it needs: %s", s)
		}
	}
	t.Logf("documented list: %d commands; ACL log: %d refusals, all of CONFIG GET", len(cmds), len(entries))

	// Without SCAN, stats given no queue says what to grant or give.
	if err := h.rdb.Do(ctx, "ACL", "SETUSER", "dispatcher", "-scan").Err(); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runCLI(t, bare, "stats")
	if code != 2 || !strings.Contains(errOut, "NOPERM") || !strings.Contains(errOut, "grant +scan, or name the queues with --queue or DISPATCHER_QUEUES") || strings.Contains(errOut, password) {
		t.Errorf("dispatcher stats with no queue settings and no SCAN: exit %d, want 2 and an error naming SCAN's refusal and what to grant or give instead, without the password:\n%s", code, errOut)
	}
}
