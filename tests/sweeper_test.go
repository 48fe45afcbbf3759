package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// tryMetric reads one sample from an instance's /metrics, if it answers.
func tryMetric(addr, series string) (float64, bool) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// sweepers counts the instances that report holding the queue's sweeper role.
func sweepers(t *testing.T, addrs []string, procs []*proc, queue string) (n int, who int) {
	who = -1
	for i, a := range addrs {
		if !procs[i].running() {
			continue
		}
		if v, ok := tryMetric(a, `dispatcher_sweeper{queue="`+queue+`"}`); ok && v == 1 {
			n++
			who = i
		}
	}
	return n, who
}

// TestOneSweeperPerQueue: of several instances only one polls the shards;
// when it is killed or stopped another takes over, and a backlog still
// gets every instance claiming.
func TestOneSweeperPerQueue(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "sw", Shards: 8})
	var addrs []string
	var procs []*proc
	for i := 0; i < 3; i++ {
		addrs = append(addrs, testenv.FreeAddr(t))
		h.extra["DISPATCHER_HTTP_ADDR"] = addrs[i]
		procs = append(procs, h.start())
	}
	one := func(what string) int {
		t.Helper()
		who := -1
		eventually(t, 10*time.Second, what, func() bool {
			var n int
			n, who = sweepers(t, addrs, procs, "sw")
			return n == 1
		})
		return who
	}
	first := one("exactly one sweeper")
	p := h.producer("sw")
	p.SetWakeWithin(0) // only ZADDs: found by the sweeper's polling
	want := scheduleSpread(t, p, "a", 2000, time.Now().Add(300*time.Millisecond), time.Second)
	h.verify("sw", want, 20*time.Second, 0)

	// Killed: its role expires and another instance takes it.
	procs[first].signal(syscall.SIGKILL)
	procs[first].wait(5 * time.Second)
	second := one("a new sweeper after SIGKILL")
	want = scheduleSpread(t, p, "b", 2000, time.Now().Add(300*time.Millisecond), time.Second)
	h.verify("sw", want, 20*time.Second, 0)

	// A backlog: both remaining instances claim, not only the sweeper.
	want = scheduleSpread(t, p, "c", 20000, time.Now().Add(-time.Second), time.Second)
	h.verify("sw", want, 60*time.Second, 0)
	helped := 0
	for i, a := range addrs {
		if procs[i].running() && metricSum(t, a, `dispatcher_tasks_dispatched_total{queue="sw"}`) > 0 {
			helped++
		}
	}
	if helped < 2 {
		t.Errorf("only %d of 2 instances dispatched from a backlog of 20000", helped)
	}

	// Stopped: it gives the role up and the last instance takes it.
	procs[second].signal(syscall.SIGTERM)
	if code := procs[second].wait(15 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	one("a new sweeper after SIGTERM")
	want = scheduleSpread(t, p, "d", 500, time.Now().Add(300*time.Millisecond), 500*time.Millisecond)
	h.verify("sw", want, 20*time.Second, 0)
}

// TestWakeUps: with a poll interval far too long to find new tasks in
// time, a task due now still goes out at once when the Go producer wakes
// the dispatcher, or when Redis publishes keyspace events and the
// producer only ZADDs.
func TestWakeUps(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"notify-keyspace-events Kz"}})
	for _, c := range []struct {
		name     string
		url      string
		rdb      func() *harness
		producer func(*shard.Producer)
	}{
		{"producer", testenv.RedisURL(t), func() *harness { return newHarness(t, queueSpec{Name: "wake", Shards: 4}) },
			func(*shard.Producer) {}},
		{"keyspace", srv.URL(), func() *harness { return newHarnessOn(t, srv.Client(), queueSpec{Name: "wake", Shards: 4}) },
			func(p *shard.Producer) { p.SetWakeWithin(0) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := c.rdb()
			h.t = t
			h.extra["DISPATCHER_REDIS_URL"] = c.url
			h.extra["DISPATCHER_POLL_INTERVAL"] = "1h"
			h.start()
			p := h.producer("wake")
			c.producer(p)
			time.Sleep(time.Second) // connected, subscribed, first sweep done
			for i := 0; i < 5; i++ {
				m := []byte(fmt.Sprintf("now-%d", i))
				due := time.Now()
				if err := p.Schedule(context.Background(), m, due); err != nil {
					t.Fatal(err)
				}
				want := map[string]int64{shard.MessageID(m, due.UnixMilli()): due.UnixMilli()}
				// Without a wake-up it would wait for the next poll: on the
				// hour grid, hardly within the 3 s this waits.
				o := h.verify("wake", want, 3*time.Second, 0)
				if o.Missing > 0 {
					return
				}
			}
		})
	}
}
