package tests

import (
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// Network faults between the dispatcher and Redis or RabbitMQ, made by a
// fault proxy in the test process (netproxy_test.go). Only the dispatcher
// goes through the proxy; the test schedules and consumes directly, so the
// figures are what a real producer and consumer would see.

// netSettings keep each test short: a lease and confirm timeout of
// seconds and retries capped at 2s.
var netSettings = map[string]string{
	"DISPATCHER_LEASE":            "3s",
	"DISPATCHER_CONFIRM_TIMEOUT":  "1s",
	"DISPATCHER_RETRY_MIN":        "500ms",
	"DISPATCHER_RETRY_MAX":        "2s",
	"DISPATCHER_SHUTDOWN_TIMEOUT": "2s",
}

// noRetrySettings give a confirm more time than a slowed path needs even
// on a busy machine, so that latency alone must not cause a retry, and
// with it a duplicate.
var noRetrySettings = map[string]string{"DISPATCHER_CONFIRM_TIMEOUT": "2500ms"}

// netHeartbeat asks for AMQP heartbeats every 2s instead of amqp091-go's
// 10s (the URL's heartbeat wins over the client's setting), so a broker
// connection that went silent is found dead after 1.5 heartbeats, 3s.
const netHeartbeat = "?heartbeat=2"

// netRig is one dispatcher whose Redis or AMQP connection goes through a
// fault proxy.
type netRig struct {
	t     *testing.T
	h     *harness
	proxy *netProxy
	p     *proc
	start time.Time // when the traffic was scheduled
}

// startNetRig starts a dispatcher on one queue with its connection to via
// ("redis" or "amqp") going through a new fault proxy, and waits until it
// dispatches. settings, if given, add to or override netSettings.
func startNetRig(t *testing.T, via string, settings ...map[string]string) *netRig {
	t.Helper()
	h := newHarness(t, queueSpec{Name: "net", Shards: 8})
	maps.Copy(h.extra, netSettings)
	for _, s := range settings {
		maps.Copy(h.extra, s)
	}
	amqpURL := testenv.AMQPURL(t) + netHeartbeat
	var np *netProxy
	switch via {
	case "redis":
		np = newNetProxy(t, testenv.HostPort(testenv.RedisURL(t)))
		h.extra["DISPATCHER_REDIS_URL"] = np.url(testenv.RedisURL(t))
		h.extra["DISPATCHER_AMQP_URL"] = amqpURL
	case "amqp":
		np = newNetProxy(t, testenv.HostPort(testenv.AMQPURL(t)))
		h.extra["DISPATCHER_AMQP_URL"] = np.url(amqpURL)
	default:
		t.Fatalf("unknown path %q", via)
	}
	p := h.start()
	eventually(t, 15*time.Second, "the dispatcher to connect and dispatch", func() bool {
		out := p.out.String()
		return strings.Contains(out, "msg=dispatching") && strings.Contains(out, "broker connected")
	})
	return &netRig{t: t, h: h, proxy: np, p: p}
}

// traffic schedules n tasks "<tag>-<i>" due evenly over span from 300 ms
// on; a size over 16 pads members to about size bytes.
func (r *netRig) traffic(tag string, n int, span time.Duration, size int) map[string]int64 {
	r.t.Helper()
	if r.start.IsZero() {
		r.start = time.Now()
	}
	if size > 16 {
		tag += strings.Repeat("x", size-16)
	}
	return scheduleSpread(r.t, r.h.producer("net"), tag, n, r.start.Add(300*time.Millisecond), span)
}

// at sleeps until d after the traffic was scheduled.
func (r *netRig) at(d time.Duration) { time.Sleep(time.Until(r.start.Add(d))) }

// logged waits up to timeout for the dispatcher's output to contain s,
// failing the test (without stopping it) if it does not, and logs how long
// it took.
func (r *netRig) logged(timeout time.Duration, s string) {
	began := time.Now()
	for !strings.Contains(r.p.out.String(), s) {
		if time.Since(began) > timeout {
			r.t.Errorf("dispatcher did not log %q within %s", s, timeout)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Logf("dispatcher logged %q %s after the test began to wait for it", s, time.Since(began).Round(10*time.Millisecond))
}

// verify reports the deliveries as h.verify does, collecting them while
// fault runs, so that each is timed when it arrives.
func (r *netRig) verify(want map[string]int64, maxDups int, fault func()) outcome {
	r.t.Helper()
	return verifyWhile(r.h, "net", want, 40*time.Second, maxDups, fault)
}

// TestNetRedis puts faults between the dispatcher and Redis while tasks
// fall due steadily. Nothing may be lost or early; duplicates can only
// come from tasks whose claim or acknowledgement was cut off.
func TestNetRedis(t *testing.T) {
	t.Run("latency", func(t *testing.T) {
		// 50 ms ± 20 ms each way on every Redis round trip, whole run.
		r := startNetRig(t, "redis", noRetrySettings)
		r.proxy.latency(50, 20)
		want := r.traffic("t", 3000, 5*time.Second, 0)
		r.verify(want, 0, func() {})
	})
	t.Run("stall", func(t *testing.T) {
		// Redis stops answering for 4s, longer than the read timeout (3s):
		// calls time out, retries hang on new connections, and when data
		// flows again the commands held in the proxy still run, among them
		// claims whose replies nobody reads any more (their lease brings
		// those tasks back).
		r := startNetRig(t, "redis")
		want := r.traffic("t", 3000, 6*time.Second, 0)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			resume := r.proxy.stall()
			r.at(5500 * time.Millisecond)
			resume()
		})
	})
	t.Run("half-open", func(t *testing.T) {
		// Every connection to Redis, old and new, silently stops passing
		// data. The dispatcher must notice by itself while it lasts (read
		// timeouts), not only when the proxy finally closes them. It takes
		// a few timeouts of 3s: the call on the dead connection, its retry,
		// and the handshake of a new connection.
		r := startNetRig(t, "redis")
		want := r.traffic("t", 3000, 6*time.Second, 0)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			heal := r.proxy.halfOpen()
			defer heal()
			r.logged(15*time.Second, "redis unavailable")
		})
	})
	t.Run("reset", func(t *testing.T) {
		// For 1.5s every connection is closed on its next data, new ones
		// with RST, again and again as the dispatcher reconnects.
		r := startNetRig(t, "redis")
		want := r.traffic("t", 3000, 5*time.Second, 0)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			stop := r.proxy.resetPeer(0)
			r.at(3 * time.Second)
			stop()
		})
	})
	t.Run("cut", func(t *testing.T) {
		// Every connection to Redis is cut (FIN) three times, 700 ms
		// apart, in the middle of the traffic.
		r := startNetRig(t, "redis")
		want := r.traffic("t", 3000, 5*time.Second, 0)
		r.verify(want, len(want), func() {
			for i := 0; i < 3; i++ {
				r.at(1500*time.Millisecond + time.Duration(i)*700*time.Millisecond)
				r.proxy.cutAll()
			}
		})
	})
}

// TestNetAMQP puts faults between the dispatcher and RabbitMQ while tasks
// fall due steadily.
func TestNetAMQP(t *testing.T) {
	t.Run("latency", func(t *testing.T) {
		// 50 ms ± 20 ms each way: publishes and confirms arrive late.
		r := startNetRig(t, "amqp", noRetrySettings)
		r.proxy.latency(50, 20)
		want := r.traffic("t", 3000, 5*time.Second, 0)
		r.verify(want, 0, func() {})
	})
	t.Run("stall", func(t *testing.T) {
		// The broker stops reading and answering for 5s, and 10 MB of
		// tasks fall due at once in it: confirms stop, the socket buffers
		// fill, writes block. Confirm timeouts, the write deadline and the
		// heartbeat must free the dispatcher, which reconnects once data
		// flows again.
		r := startNetRig(t, "amqp")
		want := r.traffic("t", 3000, 6*time.Second, 0)
		burst := scheduleSpread(t, r.h.producer("net"), "burst"+strings.Repeat("x", 16<<10), 600, r.start.Add(2*time.Second), time.Millisecond)
		want = mergeWant(want, burst)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			resume := r.proxy.stall()
			defer resume()
			r.logged(5*time.Second, "kind=timeout")
			r.logged(5*time.Second, "broker connection lost")
			r.at(6500 * time.Millisecond)
		})
	})
	t.Run("half-open", func(t *testing.T) {
		// Every connection to the broker silently stops passing data. The
		// dispatcher must find its connection dead by itself (heartbeats
		// stop) while the fault lasts, and publish everything once a new
		// connection gets through.
		r := startNetRig(t, "amqp")
		want := r.traffic("t", 3000, 6*time.Second, 0)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			heal := r.proxy.halfOpen()
			defer heal()
			r.logged(8*time.Second, "broker connection lost")
		})
	})
	t.Run("reset", func(t *testing.T) {
		// For 1.5s every connection is closed on its next data, new ones
		// with RST.
		r := startNetRig(t, "amqp")
		want := r.traffic("t", 3000, 5*time.Second, 0)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			stop := r.proxy.resetPeer(0)
			defer stop()
			r.logged(5*time.Second, "broker connection lost")
			r.at(3 * time.Second)
		})
	})
	t.Run("flap", func(t *testing.T) {
		// For 3s each connection to the broker dies after 64 KiB from the
		// dispatcher, a few hundred publishes, so it reconnects again and
		// again mid-batch.
		r := startNetRig(t, "amqp")
		want := r.traffic("t", 3000, 5*time.Second, 0)
		r.verify(want, len(want), func() {
			r.at(1500 * time.Millisecond)
			stop := r.proxy.limitData(64<<10, upstream)
			defer stop()
			r.logged(5*time.Second, "broker connection lost")
			r.at(4500 * time.Millisecond)
		})
	})
}

// TestNetSIGTERMWhileAMQPStalled stops the dispatcher while the broker
// has stopped reading with megabytes of publishes in the way: it must exit
// within its shutdown timeout plus a little, not hang on a blocked write,
// and every task comes back (released, or by lease) for the next instance.
func TestNetSIGTERMWhileAMQPStalled(t *testing.T) {
	r := startNetRig(t, "amqp")
	want := r.traffic("t", 1000, 4*time.Second, 0)
	burst := scheduleSpread(t, r.h.producer("net"), "burst"+strings.Repeat("x", 16<<10), 600, r.start.Add(2*time.Second), time.Millisecond)
	want = mergeWant(want, burst)
	// The next instance connects directly.
	next := r.h.env()
	next["DISPATCHER_REDIS_URL"] = testenv.RedisURL(t)
	next["DISPATCHER_AMQP_URL"] = testenv.AMQPURL(t)
	r.verify(want, len(want), func() {
		r.at(1500 * time.Millisecond)
		resume := r.proxy.stall()
		defer resume()
		r.at(3 * time.Second)
		sent := time.Now()
		r.p.signal(syscall.SIGTERM)
		code := r.p.wait(30 * time.Second)
		took := time.Since(sent)
		t.Logf("exit code %d %s after SIGTERM with the broker stalled", code, took.Round(time.Millisecond))
		if code != 0 {
			t.Errorf("exit code %d after SIGTERM", code)
		}
		// DISPATCHER_SHUTDOWN_TIMEOUT, then at most one write timeout
		// (the confirm timeout, 1s) and the close handshake (1s), and 2s
		// of slack for a busy machine.
		if bound := 2*time.Second + 1*time.Second + 1*time.Second + 2*time.Second; took > bound {
			t.Errorf("took %s to exit after SIGTERM, more than the shutdown timeout plus a little (%s)", took, bound)
		}
		start(t, next)
	})
}
