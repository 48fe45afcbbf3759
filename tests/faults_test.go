package tests

import (
	"math/rand"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestThreeInstancesNoDuplicates runs 3 dispatcher processes on the same
// two queues: every task arrives, and without faults none arrives twice.
func TestThreeInstancesNoDuplicates(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "a", Shards: 16}, queueSpec{Name: "b", Shards: 5})
	for i := 0; i < 3; i++ {
		h.start()
	}
	from := time.Now().Add(300 * time.Millisecond)
	wantA := scheduleSpread(t, h.producer("a"), "a", 15000, from, 2*time.Second)
	wantB := scheduleSpread(t, h.producer("b"), "b", 5000, from, 2*time.Second)
	// No fault: a duplicate could only come from two instances claiming
	// the same task. Both queues at once: collect stamps a delivery when
	// it reads it, so a queue read second would look late.
	var wg sync.WaitGroup
	for q, want := range map[string]map[string]int64{"a": wantA, "b": wantB} {
		wg.Add(1)
		go func() { defer wg.Done(); h.verify(q, want, 60*time.Second, 0) }()
	}
	wg.Wait()
}

func first(s []string) []string {
	if len(s) > 3 {
		return s[:3]
	}
	return s
}

// TestSIGKILLUnderLoad kills dispatcher processes with SIGKILL again and
// again while tasks are due, restarting each; every task still arrives.
// Duplicates are allowed (at least once) but bounded: a killed instance can
// only resend what it had claimed and not yet forgotten, at most PIPELINE
// batches of BATCH_SIZE tasks.
func TestSIGKILLUnderLoad(t *testing.T) {
	const batch, pipeline, kills = 200, 4, 8
	h := newHarness(t, queueSpec{Name: "kill", Shards: 8})
	h.extra["DISPATCHER_LEASE"] = "2s"
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "1s"
	h.extra["DISPATCHER_BATCH_SIZE"] = strconv.Itoa(batch)
	h.extra["DISPATCHER_PIPELINE"] = strconv.Itoa(pipeline)
	procs := []*proc{h.start(), h.start(), h.start()}
	want := scheduleSpread(t, h.producer("kill"), "k", 30000, time.Now().Add(200*time.Millisecond), 5*time.Second)

	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewSource(time.Now().UnixNano()))
		for i := 0; i < kills; i++ {
			time.Sleep(time.Duration(400+rng.Intn(400)) * time.Millisecond)
			n := rng.Intn(len(procs))
			procs[n].signal(syscall.SIGKILL)
			procs[n].wait(10 * time.Second)
			procs[n] = h.start()
		}
	}()
	h.verify("kill", want, 90*time.Second, kills*pipeline*batch)
	<-done
	eventually(t, 10*time.Second, "in-flight set to empty", func() bool {
		p, f, d := h.leftovers(h.queues[0])
		return p+f+d == 0
	})
}

// TestBrokerCutsConnection has the broker close the dispatcher's
// connection several times mid-traffic: it reconnects and nothing is lost.
func TestBrokerCutsConnection(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "cut", Shards: 4})
	p := h.start()
	time.Sleep(500 * time.Millisecond)
	want := scheduleSpread(t, h.producer("cut"), "c", 20000, time.Now().Add(200*time.Millisecond), 4*time.Second)

	cuts := 0
	cutting := make(chan struct{})
	go func() {
		defer close(cutting)
		for i := 0; i < 3; i++ {
			time.Sleep(900 * time.Millisecond)
			if closeConnections(t, p.cmd.Process.Pid) > 0 {
				cuts++
			}
		}
	}()
	// A cut loses the confirms of what was on the wire; those tasks go
	// out again: at most PIPELINE batches of BATCH_SIZE (defaults 4, 500).
	h.verify("cut", want, 60*time.Second, 3*4*500)
	<-cutting
	t.Logf("broker cut the connection %d times", cuts)
	if cuts == 0 {
		t.Fatal("no connection was cut; the test proved nothing")
	}
	if !strings.Contains(p.out.String(), "reconnecting") {
		t.Fatalf("no reconnect logged")
	}
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
}

// closeConnections closes, from the broker side, the connections of the
// dispatcher with the given pid (found by their connection_name).
func closeConnections(t *testing.T, pid int) int {
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Logf("rabbitmqctl list_connections: %v %s", err, out)
		return 0
	}
	n := 0
	needle := "pid " + strconv.Itoa(pid) + "\""
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, needle) {
			continue
		}
		connPid := strings.Fields(line)[0]
		if err := exec.Command("rabbitmqctl", "-q", "close_connection", connPid, "test cuts the connection").Run(); err == nil {
			n++
		}
	}
	return n
}

// TestSIGTERMStopsCleanly stops a dispatcher with SIGTERM under traffic:
// it exits 0 and leaves nothing in flight; a new one delivers the rest.
func TestSIGTERMStopsCleanly(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "term", Shards: 4})
	p := h.start()
	want := scheduleSpread(t, h.producer("term"), "t", 20000, time.Now().Add(200*time.Millisecond), 2*time.Second)
	// A clean stop forgets exactly what the broker confirmed: no duplicate.
	verifyWhile(h, "term", want, 60*time.Second, 0, func() {
		time.Sleep(1200 * time.Millisecond)
		p.signal(syscall.SIGTERM)
		if code := p.exitCode(20 * time.Second); code != 0 {
			t.Errorf("exit code %d after SIGTERM", code)
			return
		}
		if _, f, _ := h.leftovers(h.queues[0]); f != 0 {
			t.Errorf("%d tasks left in flight after a clean stop", f)
		}
		h.start()
	})
}
