package tests

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestClockSkewedInstances runs three instances whose local clocks are 5
// minutes behind, right, and 5 minutes ahead (DISPATCHER_TEST_CLOCK_SKEW),
// under steady traffic plus a backlog that keeps all three claiming; the
// one with the right clock stops halfway, leaving the skewed two. Every
// due time and lease deadline is Redis's clock, so nothing goes out early,
// no live lease is reaped (the +5m instance would reap every lease at once
// if it went by its own clock, the lease being 2 s), and nothing twice.
func TestClockSkewedInstances(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "clock", Shards: 8})
	h.extra["DISPATCHER_LEASE"] = "2s"
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "1s"
	h.extra["DISPATCHER_BATCH_SIZE"] = "100"
	skews := []string{"-5m", "0s", "5m"}
	procs := map[string]*proc{}
	addrs := map[string]string{}
	for _, skew := range skews {
		addrs[skew] = testenv.FreeAddr(t)
		h.extra["DISPATCHER_TEST_CLOCK_SKEW"] = skew
		h.extra["DISPATCHER_HTTP_ADDR"] = addrs[skew]
		procs[skew] = h.start()
	}
	for _, skew := range skews {
		eventually(t, 10*time.Second, "instance "+skew+" started", func() bool {
			return strings.Contains(procs[skew].out.String(), "local clock skewed by") &&
				strings.Contains(procs[skew].out.String(), "dispatching")
		})
	}

	p := h.producer("clock")
	backlog := scheduleSpread(t, p, "b", 3000, time.Now().Add(1500*time.Millisecond), 100*time.Millisecond)
	f := newFeeder(t, p, "c", 5*time.Second, 10, "").start()
	var stopped, dispatchedBy string
	verifyWhile(h, "clock", mergeWant(backlog, f.want), 40*time.Second, 0, func() {
		time.Sleep(2500 * time.Millisecond)
		dispatchedBy = dispatchedPerInstance(t, skews, addrs)
		procs["0s"].signal(syscall.SIGTERM)
		if code := procs["0s"].wait(20 * time.Second); code != 0 {
			t.Errorf("instance with the right clock exited %d after SIGTERM", code)
		}
		stopped = "0s"
		f.wait()
	})
	t.Logf("dispatched per instance while all three ran: %s", dispatchedBy)
	for _, skew := range skews {
		if strings.Contains(procs[skew].out.String(), "returned tasks with expired leases") {
			t.Errorf("instance %s reaped leases:\n%s", skew, grep(procs[skew].out.String(), "expired leases"))
		}
		if skew == stopped {
			continue
		}
		if n := metricSum(t, addrs[skew], "dispatcher_tasks_reaped_total"); n != 0 {
			t.Errorf("instance %s: dispatcher_tasks_reaped_total %.0f", skew, n)
		}
		if !procs[skew].running() {
			t.Errorf("instance %s exited", skew)
		}
	}
	t.Logf("dispatched per instance at the end (0s stopped halfway): %s", dispatchedPerInstance(t, []string{"-5m", "5m"}, addrs))
}

func dispatchedPerInstance(t *testing.T, skews []string, addrs map[string]string) string {
	var out []string
	for _, skew := range skews {
		out = append(out, fmt.Sprintf("%s=%.0f", skew, metricSum(t, addrs[skew], "dispatcher_tasks_dispatched_total")))
	}
	return strings.Join(out, " ")
}
