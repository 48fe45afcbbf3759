package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestUnroutableTasksShowAsRetried schedules tasks to an exchange that has
// no queue bound for the queue's routing key (issue 22): the broker returns
// every publish and the tasks are retried over and over. A task due and not
// delivered is late wherever it waits, so the retried tasks must show in
// the metrics (their number and the age of the oldest), in
// `dispatcher stats --json`, on the status page, in the oldest due age
// and the stall watchdog, and /readyz and the log must name the cause
// with the exchange and the routing key: /readyz at once with 200, and
// with 503 once the queue stalls. Once a queue is bound, the tasks arrive
// and every figure goes back to 0.
func TestUnroutableTasksShowAsRetried(t *testing.T) {
	const queue, unbound, tasks = "unrouted", "nobody-home", 5
	addr := testenv.FreeAddr(t)
	h := newHarness(t, queueSpec{Name: queue, Shards: 2})
	exchange := h.queues[0].Exchange
	// The harness's consumer binds routing key "unrouted"; the dispatcher
	// publishes with another, which nothing is bound to.
	h.extra[config.QueuePrefix(queue)+"_ROUTING_KEY"] = unbound
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_STALL_AFTER"] = "3s"
	h.extra["DISPATCHER_STATS_INTERVAL"] = "1s"
	h.extra["DISPATCHER_RETRY_MIN"] = "200ms"
	h.extra["DISPATCHER_RETRY_MAX"] = "1s"
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	eventually(t, 10*time.Second, "the sweeping instance to export the queue's state", func() bool {
		_, ok := queueMetric(addr, "dispatcher_queue_inflight_tasks", queue)
		return ok
	})

	scheduled := time.Now()
	want := scheduleSpread(t, h.producer(queue), "u", tasks, scheduled, time.Millisecond)
	eventually(t, 20*time.Second, "the publishes to fail and be retried", func() bool {
		n, _ := queueMetric(addr, "dispatcher_tasks_retried_total", queue)
		return n >= 2*tasks
	})
	cause := fmt.Sprintf("unroutable: exchange %q has no queue bound for routing key %q", exchange, unbound)
	// Before STALL_AFTER: ready, with the cause named (a consumer-side
	// cause must not flap every instance out of service at once).
	switch code, body := readyz(addr); {
	case code == http.StatusServiceUnavailable && strings.Contains(body, "stalled"):
		t.Logf("the queue stalled before /readyz was asked (a slow machine):\n%s", body)
	case code != http.StatusOK || !strings.Contains(body, "queue "+queue+": publishes fail, tasks kept for retry: "+cause):
		t.Errorf("/readyz before the stall answered %d, want 200 naming the cause %q:\n%s", code, cause, body)
	}
	// Past the stall threshold, with a read or two after it.
	time.Sleep(time.Until(scheduled.Add(5 * time.Second)))

	metric := func(name string) float64 {
		v, ok := queueMetric(addr, name, queue)
		if !ok {
			t.Errorf("%s{queue=%q} is not exported", name, queue)
		}
		return v
	}
	if v := metric("dispatcher_queue_retried_tasks"); v != tasks {
		t.Errorf("dispatcher_queue_retried_tasks = %v, want %d", v, tasks)
	}
	if v := metric("dispatcher_queue_oldest_retried_age_seconds"); v < 3 {
		t.Errorf("dispatcher_queue_oldest_retried_age_seconds = %v, want at least 3 (due %s ago)", v, time.Since(scheduled).Round(time.Second))
	}
	if v := metric("dispatcher_queue_oldest_due_age_seconds"); v < 3 {
		t.Errorf("dispatcher_queue_oldest_due_age_seconds = %v: retried tasks are due and undelivered, so late", v)
	}
	if v := metric("dispatcher_queue_stalled"); v != 1 {
		t.Errorf("dispatcher_queue_stalled = %v after the retried tasks waited past DISPATCHER_STALL_AFTER, want 1", v)
	}

	code, body := readyz(addr)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "queue "+queue+": stalled") || !strings.Contains(body, cause) {
		t.Errorf("/readyz answered %d, want 503 with the stall and its cause %q:\n%s", code, cause, body)
	}
	line := grep(p.out.String(), "publish failed")
	for _, s := range []string{"queue=" + queue, "exchange=" + exchange, "routing_key=" + unbound, "cause=", "unroutable", "tasks="} {
		if !strings.Contains(line, s) {
			t.Errorf("the publish failure log lines lack %q:\n%s", s, line)
		}
	}
	stall := grep(p.out.String(), "queue stalled")
	if !strings.Contains(stall, "retried=5") || !strings.Contains(stall, "unroutable") {
		t.Errorf("the stall log line should count the retried tasks and name the cause:\n%s", stall)
	}

	if page, err := httpGet("http://" + addr + "/"); err != nil || !strings.Contains(page, `<td><span class="warn">5</span></td>`) {
		t.Errorf("the status page does not show the 5 retried tasks (%v)", err)
	}

	type statsDoc struct {
		Queues []struct {
			Retried    int64   `json:"retried"`
			RetriedAge float64 `json:"oldest_retried_age_seconds"`
			Age        float64 `json:"oldest_due_age_seconds"`
			Shards     []struct {
				Retried int64 `json:"retried"`
			} `json:"shards"`
		} `json:"queues"`
	}
	stats := func() statsDoc {
		out, errOut, code := runCLI(t, h.env(), "stats", "--queue", queue, "--json")
		var doc statsDoc
		if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || len(doc.Queues) != 1 {
			t.Fatalf("stats --json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		return doc
	}
	q := stats().Queues[0]
	var perShard int64
	for _, s := range q.Shards {
		perShard += s.Retried
	}
	if q.Retried != tasks || perShard != tasks || q.RetriedAge < 3 || q.Age < 3 {
		t.Errorf("stats --json: retried %d (shards %d), oldest retried age %v s, oldest due age %v s; want %d retried, both ages at least 3 s",
			q.Retried, perShard, q.RetriedAge, q.Age, tasks)
	}
	if t.Failed() {
		return
	}
	t.Logf("/readyz answered %d:\n%s\nlog lines:\n%s\n%s", code, body, line, stall)

	// Bind a queue for the routing key: the next retry of each task goes
	// through.
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	bq, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(bq.Name, unbound, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(bq.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.got[queue] = deliveries
	got, _ := countIDs(h.collect(queue, tasks, 20*time.Second))
	if m := missing(want, got); len(m) > 0 {
		t.Fatalf("%d of %d tasks never arrived once a queue was bound: %v", len(m), tasks, m)
	}
	eventually(t, 10*time.Second, "the retried figures and the stall to go back to 0", func() bool {
		n, _ := queueMetric(addr, "dispatcher_queue_retried_tasks", queue)
		age, _ := queueMetric(addr, "dispatcher_queue_oldest_retried_age_seconds", queue)
		due, _ := queueMetric(addr, "dispatcher_queue_oldest_due_age_seconds", queue)
		stalled, _ := queueMetric(addr, "dispatcher_queue_stalled", queue)
		code, body := readyz(addr)
		return n == 0 && age == 0 && due == 0 && stalled == 0 && code == http.StatusOK && !strings.Contains(body, "unroutable")
	})
	if q := stats().Queues[0]; q.Retried != 0 || q.RetriedAge != 0 {
		t.Errorf("stats --json after delivery: retried %d, oldest retried age %v s; want 0", q.Retried, q.RetriedAge)
	}
	if pending, inflight, dead := h.leftovers(h.queues[0]); pending+inflight+dead != 0 {
		t.Errorf("left in Redis: %d pending, %d in flight, %d dead", pending, inflight, dead)
	}
}
