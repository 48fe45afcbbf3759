package tests

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// RabbitMQ faults run on a private node (testenv.PrivateRabbit): stopping
// the shared broker or setting off its alarms would break every other test
// running on the machine.

// newNodeHarness is newHarness with the dispatcher and the consumers on
// node instead of the shared broker.
func newNodeHarness(t testing.TB, node *testenv.RabbitNode, queues ...queueSpec) *harness {
	t.Helper()
	h := newHarness(t)
	h.extra["DISPATCHER_AMQP_URL"] = node.AMQPURL()
	for _, q := range queues {
		q.Exchange = cmp.Or(q.Exchange, h.prefix+"."+q.Name)
		q.RoutingKey = cmp.Or(q.RoutingKey, q.Name)
		h.queues = append(h.queues, q)
		h.got[q.Name] = nodeConsumer(t, node, q.Exchange, q.RoutingKey, h.prefix+"."+q.Name)
	}
	return h
}

// nodeConsumer consumes exchange/key on node through a durable queue and
// goes on consuming across the node's restarts: stop_app closes every
// connection, and the durable queue keeps the persistent messages
// published while the consumer was away.
func nodeConsumer(t testing.TB, node *testenv.RabbitNode, exchange, key, queue string) <-chan amqp.Delivery {
	t.Helper()
	return durableConsumer(t, node.Dial, exchange, key, queue, nil)
}

// durableConsumer consumes exchange/key through a durable queue declared
// with args, on a connection from dial, and subscribes again (dial may
// give another node) whenever the connection closes. Each delivery is
// acked once it is handed over. A broker redelivery (Redelivered set) of a
// message_id already handed over is dropped and only counted: it is the
// broker sending one publish again because a cut connection lost the
// consumer's ack, not a second publish by the dispatcher, which is what
// the tests count.
func durableConsumer(t testing.TB, dial func() (*amqp.Connection, error), exchange, key, queue string, args amqp.Table) <-chan amqp.Delivery {
	t.Helper()
	subscribe := func() (*amqp.Connection, <-chan amqp.Delivery, error) {
		conn, err := dial()
		if err != nil {
			return nil, nil, err
		}
		d, err := func() (<-chan amqp.Delivery, error) {
			ch, err := conn.Channel()
			if err != nil {
				return nil, err
			}
			if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
				return nil, fmt.Errorf("declare exchange %s: %w", exchange, err)
			}
			if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
				return nil, fmt.Errorf("declare queue %s: %w", queue, err)
			}
			if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
				return nil, fmt.Errorf("bind queue %s: %w", queue, err)
			}
			if err := ch.Qos(500, 0, false); err != nil {
				return nil, err
			}
			return ch.Consume(queue, "", false, false, false, false, nil)
		}()
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		return conn, d, nil
	}
	// The first subscription is made now, so nothing published from here
	// on is unroutable.
	conn, d, err := subscribe()
	if err != nil {
		t.Fatalf("consumer of %s: %v", queue, err)
	}
	out := make(chan amqp.Delivery, 1<<16)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var reconnects, redelivered int
	wg.Add(1)
	go func() {
		defer wg.Done()
		seen := map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				conn.Close()
				return
			case m, ok := <-d:
				if ok {
					if !m.Redelivered || !seen[m.MessageId] {
						seen[m.MessageId] = true
						select {
						case out <- m:
						case <-ctx.Done():
						}
					} else {
						redelivered++
					}
					_ = m.Ack(false)
					continue
				}
			}
			// The node closed the connection: subscribe again once it is back.
			conn.Close()
			for {
				if conn, d, err = subscribe(); err == nil {
					reconnects++
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		t.Logf("consumer of %s: %d reconnects, %d broker redeliveries of messages already seen dropped", queue, reconnects, redelivered)
		c, err := dial()
		if err != nil {
			t.Logf("delete queue %s: %v", queue, err)
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	})
	return out
}

// TestRabbitAppRestart stops and starts the broker application twice
// under steady traffic (what rabbitmqctl stop_app / start_app do; see
// RabbitNode.AppOutages): the node closes every connection and refuses new
// ones for a while; the dispatcher returns what it had not got confirmed to
// pending, reconnects, and every task arrives. The test fails if no task
// fell due while the application was down.
func TestRabbitAppRestart(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	h, p := dispatchOnNode(t, node, "restart", nil)
	from := time.Now().Add(200 * time.Millisecond)
	want := scheduleSpread(t, h.producer("restart"), "r", 18000, from, 9*time.Second)

	var outages []testenv.Outage
	// Duplicates come only from publishes the broker took but whose
	// confirm the closed connection lost: at most what was in flight.
	verifyWhile(h, "restart", want, 60*time.Second, 2*500*4, func() {
		var err error
		outages, err = node.AppOutages([]time.Time{from.Add(2 * time.Second), from.Add(6 * time.Second)}, time.Second)
		if err != nil {
			t.Fatalf("restart the broker application: %v", err)
		}
	})
	dueWhileDown := 0
	for i, o := range outages {
		n := 0
		for _, due := range want {
			if due >= o.Stopped.UnixMilli() && due < o.Started.UnixMilli() {
				n++
			}
		}
		t.Logf("restart %d: application down from +%s to +%s, %d tasks fell due meanwhile",
			i+1, o.Stopped.Sub(from).Round(time.Millisecond), o.Started.Sub(from).Round(time.Millisecond), n)
		dueWhileDown += n
	}
	if dueWhileDown == 0 {
		t.Fatal("no task fell due while the application was down: the restarts missed the traffic and proved nothing")
	}
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Errorf("no lost connection logged")
	}
	drained(t, h, p)
}

// TestRabbitCrash kills the broker with SIGKILL under steady traffic and
// boots it again on its data: connections die without a close, and what
// the broker had not written to disk is gone. A task leaves Redis only once
// confirmed, and a confirmed persistent message is on the broker's disk, so
// every task still arrives.
func TestRabbitCrash(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	h, p := dispatchOnNode(t, node, "crash", nil)
	want := scheduleSpread(t, h.producer("crash"), "c", 15000, time.Now().Add(200*time.Millisecond), 6*time.Second)
	// Duplicates come only from publishes the broker stored but whose
	// confirm died with it: at most what was in flight.
	verifyWhile(h, "crash", want, 60*time.Second, 500*4, func() {
		time.Sleep(1500 * time.Millisecond)
		node.Crash()
		down := time.Now()
		if err := node.Boot(); err != nil {
			t.Fatal(err)
		}
		t.Logf("broker down for %s", time.Since(down).Round(time.Millisecond))
	})
	drained(t, h, p)
}

// dispatchOnNode starts a dispatcher of queue (8 shards) on node, with a
// short confirm timeout and lease so that what a fault leaves in flight
// comes back within the test, and waits until it is connected.
func dispatchOnNode(t *testing.T, node *testenv.RabbitNode, queue string, extra map[string]string) (*harness, *proc) {
	t.Helper()
	h := newNodeHarness(t, node, queueSpec{Name: queue, Shards: 8})
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "2s"
	h.extra["DISPATCHER_LEASE"] = "5s"
	maps.Copy(h.extra, extra)
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	return h, p
}

// drained checks that the dispatcher lived through the fault and that
// nothing of its queue is left in Redis.
func drained(t *testing.T, h *harness, p *proc) {
	t.Helper()
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
	eventually(t, 10*time.Second, "nothing left in Redis", func() bool {
		pending, inflight, dead := h.leftovers(h.queues[0])
		return pending+inflight+dead == 0
	})
}

// TestRabbitAlarm sets off the node's memory alarm, then its disk alarm,
// under steady traffic. The broker blocks the dispatcher's connection
// (connection.blocked) and stops reading from it; the dispatcher must stop
// claiming instead of taking batch after batch into flight that can never
// be confirmed: while blocked, pending stops shrinking, the in-flight set
// holds BATCH_SIZE × PIPELINE tasks at most, and /readyz says not ready.
// Once the alarm clears, everything goes out.
func TestRabbitAlarm(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	for _, resource := range []string{"memory", "disk"} {
		t.Run(resource, func(t *testing.T) { testRabbitAlarm(t, node, resource) })
	}
}

func testRabbitAlarm(t *testing.T, node *testenv.RabbitNode, resource string) {
	const batch, pipeline = 100, 2
	addr := testenv.FreeAddr(t)
	h, p := dispatchOnNode(t, node, "alarm", map[string]string{
		"DISPATCHER_HTTP_ADDR":  addr,
		"DISPATCHER_BATCH_SIZE": fmt.Sprint(batch),
		"DISPATCHER_PIPELINE":   fmt.Sprint(pipeline),
		// Short, so that several confirm timeouts pass while blocked: each
		// one frees publish slots that a dispatcher ignoring the block
		// would fill.
		"DISPATCHER_CONFIRM_TIMEOUT": "1s",
	})
	from := time.Now().Add(200 * time.Millisecond)
	want := scheduleSpread(t, h.producer("alarm"), "m", 12000, from, 10*time.Second)

	var alarmAt, blockedAt, watchFrom, clearedAt time.Time
	var ctlTook time.Duration
	var maxInflight, pendingAtBlock, pendingAtEnd int64
	// Publishes the broker took while blocked but confirmed only after
	// their confirm timeout were retried: those are the duplicates.
	verifyWhile(h, "alarm", want, 60*time.Second, batch*pipeline, func() {
		time.Sleep(1500 * time.Millisecond)
		alarmAt = time.Now()
		if err := node.SetAlarm(resource); err != nil {
			t.Fatal(err)
		}
		ctlTook = time.Since(alarmAt)
		eventually(t, 10*time.Second, "/readyz to report the blocked broker", func() bool { return readyStatus(addr) == http.StatusServiceUnavailable })
		blockedAt = time.Now()
		// A claim that passed its readiness check just before the block
		// may still land.
		time.Sleep(250 * time.Millisecond)
		watchFrom = time.Now()
		// Watch Redis for 3 confirm timeouts and more of being blocked.
		pendingAtBlock, _, _ = h.leftovers(h.queues[0])
		for time.Since(watchFrom) < 3500*time.Millisecond {
			pending, inflight, _ := h.leftovers(h.queues[0])
			maxInflight = max(maxInflight, inflight)
			pendingAtEnd = pending
			time.Sleep(50 * time.Millisecond)
		}
		code, body := readyz(addr)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "alarm") {
			t.Errorf("/readyz while the alarm was still on: %d %q, want 503 naming the alarm", code, body)
		}
		if v, _ := tryMetric(addr, "dispatcher_broker_blocked"); v != 1 {
			t.Errorf("dispatcher_broker_blocked = %v while blocked, want 1", v)
		}
		if err := node.ClearAlarm(resource); err != nil {
			t.Fatal(err)
		}
		clearedAt = time.Now()
		eventually(t, 10*time.Second, "/readyz to report ready after the alarm cleared", func() bool { return readyStatus(addr) == http.StatusOK })
	})
	dueWhileWatched := 0
	for _, due := range want {
		if due >= watchFrom.UnixMilli() && due < clearedAt.UnixMilli() {
			dueWhileWatched++
		}
	}
	t.Logf("%s alarm: blocked %s after rabbitmqctl was called (it took %s), for %s; while watched, %d tasks fell due, in flight at most %d (batch %d × pipeline %d = %d), pending %d -> %d",
		resource, blockedAt.Sub(alarmAt).Round(time.Millisecond), ctlTook.Round(time.Millisecond), clearedAt.Sub(blockedAt).Round(time.Millisecond),
		dueWhileWatched, maxInflight, batch, pipeline, batch*pipeline, pendingAtBlock, pendingAtEnd)
	if dueWhileWatched < 2*batch*pipeline {
		t.Errorf("only %d tasks fell due while the block was watched: the alarm missed the traffic and proved little", dueWhileWatched)
	}
	if maxInflight > batch*pipeline {
		t.Errorf("%d tasks in flight while blocked, more than batch × pipeline = %d", maxInflight, batch*pipeline)
	}
	if pendingAtEnd < pendingAtBlock {
		t.Errorf("pending shrank from %d to %d while the broker blocked the dispatcher: it went on claiming", pendingAtBlock, pendingAtEnd)
	}
	if v, _ := tryMetric(addr, "dispatcher_broker_blocked"); v != 0 {
		t.Errorf("dispatcher_broker_blocked = %v after the alarm cleared, want 0", v)
	}
	for _, s := range []string{"broker blocks publishing", "broker unblocked publishing"} {
		if l := grep(p.out.String(), s); l == "" {
			t.Errorf("the dispatcher did not log %q", s)
		} else {
			t.Logf("logged: %s", l)
		}
	}
	drained(t, h, p)
}

// readyStatus returns the status code of the dispatcher's /readyz at addr, 0 if
// it does not answer.
func readyStatus(addr string) int {
	code, _ := readyz(addr)
	return code
}

// readyz returns the status code and body of the dispatcher's /readyz.
func readyz(addr string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// waitLogged waits until the dispatcher's output holds s.
func waitLogged(t testing.TB, p *proc, s string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("dispatcher to log %q", s), func() bool { return strings.Contains(p.out.String(), s) })
}
