package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestUnroutableModes: tasks nothing is bound for at their due time, by
// the queue's own routing key and by a routing key of their own, under
// each DISPATCHER_QUEUE_<NAME>_UNROUTABLE: drop forgets each at its first
// return, counted and logged one line per task; dead-letter:2 and
// dead-letter (DISPATCHER_MAX_ATTEMPTS=3) dead-letter them after 2 and 3
// returns, whatever the key, and a requeue once bound delivers them;
// retry (the default) keeps the queue's own key retried and dead-letters
// a task's own key after MAX_ATTEMPTS, as before.
func TestUnroutableModes(t *testing.T) {
	const unbound, ownKey = "nobody-home", "unbound.key"
	h := newHarness(t, queueSpec{Name: "urdrop", Shards: 2}, queueSpec{Name: "urdl2", Shards: 2},
		queueSpec{Name: "urdl", Shards: 2}, queueSpec{Name: "urretry", Shards: 2})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_RETRY_MIN"] = "100ms"
	h.extra["DISPATCHER_RETRY_MAX"] = "200ms"
	h.extra["DISPATCHER_MAX_ATTEMPTS"] = "3"
	mode := map[string]string{"urdrop": "drop", "urdl2": "dead-letter:2", "urdl": "dead-letter"}
	for _, q := range h.queues {
		p := config.QueuePrefix(q.Name) + "_"
		h.extra[p+"ROUTING_KEY"] = unbound // the harness's consumer binds the queue's name
		if m := mode[q.Name]; m != "" {
			h.extra[p+"UNROUTABLE"] = m
		}
	}
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	// Per queue: 3 plain tasks (the queue's key) and 2 with an id and a
	// routing key of their own.
	now := time.Now().UnixMilli()
	for _, q := range h.queues {
		scheduleSpread(t, h.producer(q.Name), "plain", 3, time.Now(), time.Millisecond)
		for i := range 2 {
			h.scheduleID(q, fmt.Sprintf("own-%d", i), "body", `{"routing_key":"`+ownKey+`"}`, now)
		}
	}
	q := func(name string) queueSpec {
		for _, q := range h.queues {
			if q.Name == name {
				return q
			}
		}
		t.Fatalf("no queue %s", name)
		return queueSpec{}
	}
	dropped := func() int {
		n := 0
		for _, l := range strings.Split(p.out.String(), "\n") {
			if strings.Contains(l, "unroutable task dropped") && strings.Contains(l, "queue=urdrop") {
				n++
			}
		}
		return n
	}
	eventually(t, 20*time.Second, "drop: every task forgotten, and dead-letter: every task dead", func() bool {
		pd, fd, dd := h.leftovers(q("urdrop"))
		_, _, d2 := h.leftovers(q("urdl2"))
		_, _, d3 := h.leftovers(q("urdl"))
		return pd+fd+dd == 0 && dropped() == 5 && d2 == 5 && d3 == 5
	})

	// drop: counted, logged, nothing dead, no claimed field left behind.
	if v, ok := queueMetric(addr, "dispatcher_tasks_unroutable_dropped_total", "urdrop"); !ok || v != 5 {
		t.Errorf("dispatcher_tasks_unroutable_dropped_total{queue=urdrop} = %v (exported %v), want 5", v, ok)
	}
	for _, name := range []string{"urdl2", "urdl", "urretry"} {
		if v, ok := queueMetric(addr, "dispatcher_tasks_unroutable_dropped_total", name); !ok || v != 0 {
			t.Errorf("dispatcher_tasks_unroutable_dropped_total{queue=%s} = %v (exported %v), want 0", name, v, ok)
		}
	}
	if _, _, cb, cp := h.idLeftovers(q("urdrop")); cb+cp != 0 {
		t.Errorf("drop left %d claimed bodies and %d claimed properties", cb, cp)
	}
	if out := p.out.String(); !strings.Contains(out, `routing_key=`+ownKey) || !strings.Contains(out, `task_id=own-0`) {
		t.Errorf("the drop log lines name no routing key or task id:\n%s", tail(out, 3000))
	}

	// dead-letter:N and dead-letter: after N and MAX_ATTEMPTS returns.
	for name, after := range map[string]string{"urdl2": "(after 2 attempts)", "urdl": "(after 3 attempts)"} {
		rs := h.deadReasons(q(name))
		for m, why := range rs {
			if !strings.HasPrefix(why, "unroutable: ") || !strings.HasSuffix(why, after) {
				t.Errorf("%s: dead letter %s: reason %q, want unroutable ... %s", name, m, why, after)
			}
		}
	}

	// retry: the queue's own key stays in flight, retried; a task's own
	// key is dead after MAX_ATTEMPTS, as before.
	eventually(t, 10*time.Second, "retry: the tasks of their own key dead", func() bool {
		_, _, d := h.leftovers(q("urretry"))
		return d == 2
	})
	if pend, fl, _ := h.leftovers(q("urretry")); pend+fl != 3 {
		t.Errorf("retry: %d pending and %d in flight, want the 3 of the queue's key kept", pend, fl)
	}
	for m, why := range h.deadReasons(q("urretry")) {
		if !strings.Contains(why, "unroutable by its own routing_key") {
			t.Errorf("retry: dead letter %s: reason %q", m, why)
		}
	}

	// Once bound: the retried tasks arrive; the dead letters, requeued,
	// arrive; the dropped queue dispatches a new task as usual.
	for _, name := range []string{"urdrop", "urdl2", "urretry"} {
		h.got[name+"/own"] = testenv.Consumer(t, h.conn, q(name).Exchange, ownKey)
		h.got[name] = testenv.Consumer(t, h.conn, q(name).Exchange, unbound)
	}
	if got := h.collect("urretry", 3, 10*time.Second); len(got) < 3 {
		t.Errorf("retry: %d of 3 retried tasks delivered once bound", len(got))
	}
	if code, out := h.runCLI(30*time.Second, "dead", "requeue", "--queue", "urdl2", "--all"); code != 0 {
		t.Fatalf("dead requeue --all: exit %d: %s", code, out)
	}
	if got, own := h.collect("urdl2", 3, 10*time.Second), h.collect("urdl2/own", 2, 10*time.Second); len(got) < 3 || len(own) < 2 {
		t.Errorf("dead-letter: %d of 3 and %d of 2 requeued tasks delivered", len(got), len(own))
	}
	scheduleSpread(t, h.producer("urdrop"), "late", 1, time.Now(), time.Millisecond)
	got := h.collect("urdrop", 1, 10*time.Second)
	if len(got) != 1 || !strings.HasPrefix(string(got[0].d.Body), "late-") {
		var bodies []string
		for _, r := range got {
			bodies = append(bodies, string(r.d.Body))
		}
		t.Errorf("drop: once bound, delivered %q, want the new task only", bodies)
	}
	if own := h.collect("urdrop/own", 1, time.Second); len(own) != 0 {
		t.Errorf("drop: %d dropped tasks delivered", len(own))
	}
}
