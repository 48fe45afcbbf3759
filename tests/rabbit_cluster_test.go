package tests

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// These tests run the dispatcher against a 3-node RabbitMQ cluster
// (pause_minority) with a quorum queue bound to the queue's exchange; the
// cluster is started once for the package and put back after each test.

// clusterDial connects to the cluster's nodes in turn, starting after the
// node it connected to last, so a consumer whose node went away finds
// another one.
func clusterDial(c *testenv.RabbitCluster) func() (*amqp.Connection, error) {
	var next atomic.Int64
	return func() (*amqp.Connection, error) {
		var errs []string
		for range c.Nodes {
			n := c.Nodes[int(next.Add(1))%len(c.Nodes)]
			conn, err := n.Dial()
			if err == nil {
				return conn, nil
			}
			errs = append(errs, fmt.Sprintf("%s: %v", n.Name, err))
		}
		return nil, fmt.Errorf("no cluster node accepts a connection: %s", strings.Join(errs, "; "))
	}
}

// clusterRun is one dispatcher on the cluster.
type clusterRun struct {
	h    *harness
	p    *proc
	addr string // its HTTP address
}

// newClusterRun prepares a dispatcher of queue (8 shards) on c, with a
// consumer of a quorum queue bound to its exchange (declared now), a short
// confirm timeout and lease so that what a fault leaves in flight comes
// back within the test, and publish stamps.
func newClusterRun(t *testing.T, c *testenv.RabbitCluster, queue string) clusterRun {
	t.Helper()
	h := newHarness(t)
	q := queueSpec{Name: queue, Shards: 8, Exchange: h.prefix + "." + queue, RoutingKey: queue}
	h.queues = append(h.queues, q)
	h.got[queue] = durableConsumer(t, clusterDial(c), q.Exchange, q.RoutingKey, h.queueName(queue),
		amqp.Table{"x-queue-type": "quorum"})
	r := clusterRun{h: h, addr: testenv.FreeAddr(t)}
	h.extra["DISPATCHER_AMQP_URL"] = strings.Join(c.URLs(), ",")
	h.extra["DISPATCHER_HTTP_ADDR"] = r.addr
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "2s"
	h.extra["DISPATCHER_LEASE"] = "5s"
	h.extra["DISPATCHER_STAMP_PUBLISHED"] = "true"
	return r
}

// start starts the dispatcher and waits until it is connected.
func (r *clusterRun) start(t *testing.T) {
	t.Helper()
	r.p = r.h.start()
	waitLogged(t, r.p, "broker connected", 30*time.Second)
}

// node is the node the dispatcher says, on /readyz, it is connected to.
func (r clusterRun) node(t testing.TB) string {
	t.Helper()
	var node string
	eventually(t, 15*time.Second, "/readyz naming the node in use", func() bool {
		code, body := readyz(r.addr)
		_, after, ok := strings.Cut(body, "broker: connected to node ")
		after, _, _ = strings.Cut(after, "\n") // the queues' lines follow
		node = strings.TrimSpace(after)
		return code == 200 && ok && node != ""
	})
	return node
}

// firstPublishAfter is how long after t0 the first task that arrived was
// published (x-published-us, on the Redis clock of this same machine):
// the time from a node's loss to the first confirmed publish on another.
func firstPublishAfter(rs []received, t0 time.Time) (time.Duration, bool) {
	best := time.Duration(-1)
	for _, r := range rs {
		us, ok := r.d.Headers["x-published-us"].(int64)
		if !ok {
			continue
		}
		if d := time.UnixMicro(us).Sub(t0); d >= 0 && (best < 0 || d < best) {
			best = d
		}
	}
	return best, best >= 0
}

// givenUp counts the channels the dispatcher gave up because they
// confirmed nothing (a stale quorum queue leader, say).
func givenUp(p *proc) int { return strings.Count(p.out.String(), "replacing the connection") }

// lostLogged is when the dispatcher logged that its connection to node
// was lost (the log's time= field).
func lostLogged(t testing.TB, out, node string) time.Time {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "broker connection lost") || !strings.Contains(l, "node="+node) {
			continue
		}
		f, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, f)
		if err != nil {
			t.Fatalf("log line without a time: %q", l)
		}
		return at
	}
	t.Fatalf("no log line says the connection to %s was lost", node)
	return time.Time{}
}

// TestClusterNodeStopped stops the RabbitMQ application of the node the
// dispatcher is connected to (stop_app: the node closes every connection)
// under a traffic of 20,000 tasks; TestClusterNodeKilled SIGKILLs it. The
// dispatcher hands back what it had not got confirmed, goes on to another
// node, and every task arrives in the quorum queue, none early.
func TestClusterNodeStopped(t *testing.T) { testClusterNodeLoss(t, false) }

func TestClusterNodeKilled(t *testing.T) { testClusterNodeLoss(t, true) }

func testClusterNodeLoss(t *testing.T, kill bool) {
	c := testenv.SharedRabbitCluster(t)
	r := newClusterRun(t, c, "failover")
	r.start(t) // on a node of its own choosing (shuffled)
	first := r.node(t)
	victim := c.NodeAt(first)
	if victim == nil {
		t.Fatalf("dispatcher connected to %q, not a node of the cluster %v", first, c.URLs())
	}
	from := time.Now().Add(300 * time.Millisecond)
	want := scheduleSpread(t, r.h.producer("failover"), "f", 20000, from, 8*time.Second)

	var lost time.Time
	// Duplicates come only from publishes the lost node took but whose
	// confirm died with the connection: at most what was in flight.
	o := verifyWhile(r.h, "failover", want, 90*time.Second, 500*4, func() {
		time.Sleep(time.Until(from.Add(2500 * time.Millisecond)))
		lost = time.Now()
		if kill {
			victim.Crash()
		} else if err := victim.StopApp(); err != nil {
			t.Errorf("stop_app on %s: %v", victim.Name, err)
		}
	})
	// From the moment the dispatcher saw the node go, whatever it
	// publishes goes to another node: the first of those that arrived
	// marks the switch. (stop_app's own start takes a second or two, so
	// the loss is timed by the dispatcher's log, and the kill by the test.)
	noticed := lostLogged(t, r.p.out.String(), first)
	switched, ok := firstPublishAfter(r.h.delivered["failover"], noticed)
	now := r.node(t)
	t.Logf("CLUSTER %s: node %s lost (fault began at +%s, seen by the dispatcher %s later); first confirmed publish on %s %s after that; channels given up %d; scheduled=%d delivered=%d missing=%d duplicates=%d worst_late_ms=%d",
		t.Name(), first, lost.Sub(from).Round(time.Millisecond), noticed.Sub(lost).Round(time.Millisecond), now, switched.Round(time.Millisecond),
		givenUp(r.p), o.Scheduled, o.Delivered, o.Missing, o.Duplicates, o.WorstLate.Milliseconds())
	if now == first {
		t.Errorf("still connected to the lost node %s", first)
	}
	if seen := noticed.Sub(lost); seen > 30*time.Second {
		t.Errorf("the dispatcher saw the loss %s after the fault began", seen)
	}
	if !ok {
		t.Error("no task was published after the node was lost: the fault missed the traffic")
	} else if switched > 20*time.Second {
		t.Errorf("the first publish on another node came %s after the loss", switched)
	}
	if v, _ := tryMetric(r.addr, "dispatcher_broker_node_switches_total"); v < 1 {
		t.Errorf("dispatcher_broker_node_switches_total = %v, want at least 1", v)
	}
	if v, _ := tryMetric(r.addr, fmt.Sprintf("dispatcher_broker_node{node=%q}", now)); v != 1 {
		t.Errorf("dispatcher_broker_node{node=%q} = %v, want 1", now, v)
	}
	if out := r.p.out.String(); !strings.Contains(out, "previous_node="+first) {
		t.Errorf("no log line names the node left behind (previous_node=%s)", first)
	}
	drained(t, r.h, r.p)
}

// TestClusterPartition cuts the node the dispatcher is connected to, the
// quorum queue's leader, off from the other two under traffic (an Erlang
// distribution partition; see RabbitCluster.Isolate). With pause_minority the isolated node pauses and
// closes its connections; what was published to it without a confirm
// comes back and goes out through the majority. Nothing is lost.
func TestClusterPartition(t *testing.T) {
	c := testenv.SharedRabbitCluster(t)
	r := newClusterRun(t, c, "partition")
	// The hardest case: the dispatcher on the node of the queue's leader,
	// which the majority replaces while the dispatcher's next channel may
	// still send to the old one.
	victim, err := c.QueueLeader(r.h.queueName("partition"))
	if err != nil {
		t.Fatal(err)
	}
	first := "127.0.0.1:" + strconv.Itoa(victim.Port)
	urls := []string{victim.AMQPURL()}
	for _, u := range c.URLs() {
		if u != victim.AMQPURL() {
			urls = append(urls, u)
		}
	}
	r.h.extra["DISPATCHER_AMQP_URL"] = strings.Join(urls, ",")
	r.h.extra["DISPATCHER_AMQP_NODE_ORDER"] = "listed"
	r.start(t)
	if got := r.node(t); got != first {
		t.Fatalf("dispatcher on %s, want the leader's node %s", got, first)
	}
	from := time.Now().Add(300 * time.Millisecond)
	want := scheduleSpread(t, r.h.producer("partition"), "p", 20000, from, 8*time.Second)
	var cut time.Time
	o := verifyWhile(r.h, "partition", want, 90*time.Second, 500*4, func() {
		time.Sleep(time.Until(from.Add(2500 * time.Millisecond)))
		cut = time.Now()
		if err := c.Isolate(victim); err != nil {
			t.Errorf("isolate %s: %v", victim.Name, err)
		}
		t.Logf("%s isolated in %s", victim.Name, time.Since(cut).Round(time.Millisecond))

	})
	noticed := lostLogged(t, r.p.out.String(), first)
	switched, ok := firstPublishAfter(r.h.delivered["partition"], noticed)
	now := r.node(t)
	unconfirmed := 0.0
	for _, kind := range []string{"lost", "timeout", "nack"} {
		v, _ := tryMetric(r.addr, fmt.Sprintf("dispatcher_errors_total{kind=%q,queue=%q}", kind, "partition"))
		unconfirmed += v
	}
	t.Logf("CLUSTER %s: node %s isolated at +%s, seen lost by the dispatcher %s later; first confirmed publish on %s %s after that; channels given up %d; publishes not confirmed (lost, timeout, nack) %v; scheduled=%d delivered=%d missing=%d duplicates=%d worst_late_ms=%d",
		t.Name(), first, cut.Sub(from).Round(time.Millisecond), noticed.Sub(cut).Round(time.Millisecond), now, switched.Round(time.Millisecond), givenUp(r.p), unconfirmed,
		o.Scheduled, o.Delivered, o.Missing, o.Duplicates, o.WorstLate.Milliseconds())
	if now == first {
		t.Errorf("still connected to the isolated node %s", first)
	}
	if !ok {
		t.Error("no task was published after the partition: the fault missed the traffic")
	}
	if unconfirmed == 0 {
		t.Error("no publish went unconfirmed: the partition did not catch a publish on the isolated node")
	}
	if err := c.Heal(victim); err != nil {
		t.Fatalf("heal %s: %v", victim.Name, err)
	}
	drained(t, r.h, r.p)
}

// TestClusterFirstURLDead lists a node that does not answer first, with
// DISPATCHER_AMQP_NODE_ORDER=listed: the dispatcher starts on the next
// node, says which, and dispatches.
func TestClusterFirstURLDead(t *testing.T) {
	c := testenv.SharedRabbitCluster(t)
	const dead = "127.0.0.1:1" // tcpmux: nothing listens, connections are refused
	r := newClusterRun(t, c, "firstdead")
	r.h.extra["DISPATCHER_AMQP_URL"] = strings.Join(append([]string{"amqp://guest:guest@" + dead + "/"}, c.URLs()...), ",")
	r.h.extra["DISPATCHER_AMQP_NODE_ORDER"] = "listed"
	r.start(t)
	if got, want := r.node(t), testenv.HostPort(c.URLs()[0]); got != want {
		t.Errorf("connected to %s, want the second URL's node %s", got, want)
	}
	out := r.p.out.String()
	if !strings.Contains(out, "trying the next node") || !strings.Contains(out, "node="+dead) {
		t.Errorf("no log line names the dead node %s:\n%s", dead, tail(out, 2000))
	}
	want := scheduleSpread(t, r.h.producer("firstdead"), "d", 500, time.Now().Add(200*time.Millisecond), time.Second)
	r.h.verify("firstdead", want, 30*time.Second, 0)
	drained(t, r.h, r.p)
}
