package publisher

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/internal/tlsfiles"
)

// lockedBuffer is a log destination the test reads while the publisher
// writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// twoNodes are two nodes for failover tests, both the shared broker: first
// reached through a proxy the test can cut or silence, then live, reached
// directly.
func twoNodes(t *testing.T) (proxy *netProxy, first, live string) {
	t.Helper()
	live = testenv.AMQPURL(t)
	proxy = newNetProxy(t, testenv.HostPort(live))
	return proxy, proxy.url(live), live
}

// boundExchange is a new exchange with a consumer of routing key "bound".
func boundExchange(t *testing.T) (string, <-chan amqp.Delivery) {
	t.Helper()
	ex := testenv.Name(t)
	return ex, testenv.Consumer(t, testenv.AMQP(t), ex, "bound")
}

// The first node of the list is dead: the publisher goes on to the next
// at once and connects there. No switch is counted: it never had a node.
func TestFirstNodeDead(t *testing.T) {
	live := testenv.AMQPURL(t)
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	p := runPublisherWith(t, Options{
		URLs:    []string{"amqp://guest:s3cr3t@127.0.0.1:1/", live},
		Metrics: NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if got, want := p.State().Node, testenv.HostPort(live); got != want {
		t.Fatalf("Node() = %q, want %q", got, want)
	}
	if n := testutil.ToFloat64(p.opt.Metrics.switches); n != 0 {
		t.Errorf("switches = %v, want 0", n)
	}
	if n := testutil.ToFloat64(p.opt.Metrics.connectErrors); n < 1 {
		t.Errorf("connect errors = %v, want at least 1", n)
	}
	if n := testutil.ToFloat64(p.opt.Metrics.node.WithLabelValues("127.0.0.1:1")); n != 0 {
		t.Errorf("dead node's gauge = %v, want 0", n)
	}
	out := logs.String()
	if !strings.Contains(out, "trying the next node") || !strings.Contains(out, "node=127.0.0.1:1") {
		t.Errorf("no connect failure naming the dead node logged:\n%s", out)
	}
	if strings.Contains(out, "s3cr3t") {
		t.Errorf("log shows the password:\n%s", out)
	}
}

// The node in use goes away (its listener and every connection through it
// close): the publisher connects to the next node, says so in its log and
// metrics, and publishes there.
func TestNodeFailover(t *testing.T) {
	ex, got := boundExchange(t)
	proxy, first, live := twoNodes(t)
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	p := runPublisherWith(t, Options{
		URLs: []string{first, live}, Exchanges: []string{ex}, ConfirmTimeout: 5 * time.Second,
		Metrics: NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if got, want := p.State().Node, testenv.HostPort(first); got != want {
		t.Fatalf("Node() = %q, want the first node %q", got, want)
	}
	publishOne := func(id string) {
		t.Helper()
		errs := p.Publish(context.Background(), []Message{{Exchange: ex, RoutingKey: "bound", Body: []byte(id), MessageID: id, DueMs: 1}})
		if errs[0] != nil {
			t.Fatalf("publish %s on %s: %v", id, p.State().Node, errs[0])
		}
		select {
		case d := <-got:
			if d.MessageId != id {
				t.Fatalf("got %q, want %q", d.MessageId, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not delivered", id)
		}
	}
	publishOne("before")

	proxy.p.Stop() // the node is gone: connections cut, new ones refused
	waitNode(t, p, testenv.HostPort(live), 10*time.Second)
	publishOne("after")

	m := p.opt.Metrics
	if n := testutil.ToFloat64(m.switches); n != 1 {
		t.Errorf("switches = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.node.WithLabelValues(testenv.HostPort(live))); n != 1 {
		t.Errorf("gauge of the node in use = %v, want 1", n)
	}
	if n := testutil.ToFloat64(m.node.WithLabelValues(testenv.HostPort(first))); n != 0 {
		t.Errorf("gauge of the lost node = %v, want 0", n)
	}
	out := logs.String()
	for _, want := range []string{"broker connection lost", "node=" + testenv.HostPort(first), "previous_node=" + testenv.HostPort(first)} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// waitNode waits until p is connected to node, failing the test after
// within.
func waitNode(t *testing.T, p *Publisher, node string, within time.Duration) {
	t.Helper()
	from := time.Now()
	for p.State().Node != node {
		if time.Since(from) > within {
			t.Fatalf("still on %q %s later, want %s", p.State().Node, within, node)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("on node %s after %s", node, time.Since(from).Round(time.Millisecond))
}

// Shuffled is a permutation, and each node comes first about as often as
// the others: instances spread over the nodes.
func TestShuffledSpreads(t *testing.T) {
	urls := []string{"amqp://a", "amqp://b", "amqp://c"}
	first := map[string]int{}
	const n = 3000
	for range n {
		s := Shuffled(urls)
		sorted := slices.Sorted(slices.Values(s))
		if !slices.Equal(sorted, urls) {
			t.Fatalf("Shuffled(%q) = %q: not a permutation", urls, s)
		}
		first[s[0]]++
	}
	for _, u := range urls {
		if f := float64(first[u]) / n; f < 0.25 || f > 0.42 {
			t.Errorf("%s first in %.0f%% of %d shuffles, want about a third: %v", u, 100*f, n, first)
		}
	}
	if !slices.Equal(urls, []string{"amqp://a", "amqp://b", "amqp://c"}) {
		t.Error("Shuffled changed its argument")
	}
}

// A channel that stops confirming while the connection looks alive (in a
// RabbitMQ cluster: a channel still sending to a quorum queue leader on a
// node cut off from it) is given up after one confirm timeout without an
// answer: the publisher reconnects, to the next node, instead of timing
// out publish after publish on it until a heartbeat fails, which may be
// never.
func TestSilentChannelReplaced(t *testing.T) {
	ex, got := boundExchange(t)
	proxy, first, live := twoNodes(t)
	p := runPublisherWith(t, Options{URLs: []string{first, live}, Exchanges: []string{ex}, ConfirmTimeout: time.Second})
	// Nothing comes back from the broker any more; heartbeats included,
	// but they would take 15 s (3 × half the 10 s heartbeat) to tell.
	proxy.toxic("timeout", "downstream", map[string]int64{"timeout": 0})
	errs := p.Publish(context.Background(), []Message{{Exchange: ex, RoutingKey: "bound", Body: []byte("a"), MessageID: "a", DueMs: 1}})
	if Kind(errs[0]) != "timeout" {
		t.Fatalf("publish through the silent node: %v, want a timeout", errs[0])
	}
	// Sooner than the heartbeat could tell.
	waitNode(t, p, testenv.HostPort(live), 8*time.Second)
	if errs := p.Publish(context.Background(), []Message{{Exchange: ex, RoutingKey: "bound", Body: []byte("b"), MessageID: "b", DueMs: 1}}); errs[0] != nil {
		t.Fatalf("publish on the next node: %v", errs[0])
	}
	for {
		select {
		case d := <-got:
			if d.MessageId == "b" {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("b not delivered")
		}
	}
}

// A list mixing amqps:// and amqp:// nodes: the TLS settings serve the
// amqps:// node, the plain one is reached without them, and the publisher
// fails over from one to the other.
func TestMixedSchemesFailover(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	tlsCfg, err := tlsfiles.Files{CA: node.Certs.CA, Cert: node.Certs.ClientCert, Key: node.Certs.ClientKey}.Config()
	if err != nil {
		t.Fatal(err)
	}
	ex := testenv.Name(t)
	plain := testenv.AMQPURL(t)
	p := runPublisherWith(t, Options{
		URLs: []string{node.AMQPSURL("guest", "guest"), plain}, TLS: tlsCfg, Exchanges: []string{ex}, ConfirmTimeout: 5 * time.Second,
	})
	if got, want := p.State().Node, "localhost:"+strconv.Itoa(node.TLSPort); got != want {
		t.Fatalf("Node() = %q, want the amqps:// node %q", got, want)
	}
	publish := func() error {
		return p.Publish(context.Background(), []Message{{Exchange: ex, Body: []byte("x"), MessageID: "x", DueMs: 1}})[0]
	}
	if err := publish(); err != nil && Kind(err) != "returned" { // no queue bound: returned, yet confirmed
		t.Fatalf("publish over TLS: %v", err)
	}
	if err := node.StopApp(); err != nil {
		t.Fatal(err)
	}
	waitNode(t, p, testenv.HostPort(plain), 15*time.Second)
	if err := publish(); err != nil && Kind(err) != "returned" {
		t.Fatalf("publish on the plain node: %v", err)
	}
}

// A channel whose publishes are all nacked for a whole confirm timeout is
// given up too: the cluster tests saw a channel nack every publish for
// minutes while its quorum queue had a new leader elsewhere. Here a queue
// that rejects every publish (x-max-length 0, reject-publish) makes the
// broker nack; the publisher moves to the next node once no ack came for
// the timeout, and not before.
func TestNackingChannelReplaced(t *testing.T) {
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(ex, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "full", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	_, first, live := twoNodes(t)
	const timeout = time.Second
	p := runPublisherWith(t, Options{URLs: []string{first, live}, Exchanges: []string{ex}, ConfirmTimeout: timeout})
	// Connected first: a publish before that fails "not connected" (it
	// did once, on a loaded machine), which is not what this test is about.
	waitNode(t, p, testenv.HostPort(first), 15*time.Second)
	began := time.Now()
	for time.Since(began) < timeout {
		errs := p.Publish(context.Background(), []Message{{Exchange: ex, RoutingKey: "full", Body: []byte("x"), MessageID: "x", DueMs: 1}})
		if Kind(errs[0]) != "nack" {
			t.Fatalf("publish to the full queue: %v, want a nack", errs[0])
		}
		if p.State().Node != testenv.HostPort(first) {
			t.Fatalf("left the node %s after nacks for only %s", first, time.Since(began).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// One more nack, now past the timeout without an ack.
	if errs := p.Publish(context.Background(), []Message{{Exchange: ex, RoutingKey: "full", Body: []byte("x"), MessageID: "x", DueMs: 1}}); Kind(errs[0]) != "nack" {
		t.Fatalf("publish to the full queue: %v, want a nack", errs[0])
	}
	waitNode(t, p, testenv.HostPort(live), 5*time.Second)
}

// An idle period is not "confirmed nothing": a channel that had nothing to
// confirm for longer than the confirm timeout, and then gets one nack
// (a reject-publish queue that is full) among many publishes that are
// fine, keeps its connection and node, and those publishes are confirmed.
// (Counting from the ack before the idle period, that one nack closed the
// connection and every publish in flight on it failed as lost.)
func TestNackAfterIdleKeepsChannel(t *testing.T) {
	conn := testenv.AMQP(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	full, ok := testenv.Name(t)+"-full", testenv.Name(t)+"-ok"
	for _, ex := range []string{full, ok} {
		if err := ch.ExchangeDeclare(ex, "direct", false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for ex, args := range map[string]amqp.Table{
		full: {"x-max-length": int32(1), "x-overflow": "reject-publish"},
		ok:   nil,
	} {
		q, err := ch.QueueDeclare("", false, true, true, false, args)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q.Name, "k", ex, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, first, live := twoNodes(t)
	const timeout = time.Second
	reg := prometheus.NewRegistry()
	p := runPublisherWith(t, Options{URLs: []string{first, live}, Exchanges: []string{full, ok}, ConfirmTimeout: timeout, Metrics: NewMetrics(reg)})
	s, _ := p.session()
	one := func(id string) error {
		return p.Publish(context.Background(), []Message{{Exchange: full, RoutingKey: "k", Body: []byte(id), MessageID: id, DueMs: 1}})[0]
	}
	// The queue takes one message (acked), and is full from then on.
	if err := one("fill"); err != nil {
		t.Fatalf("publish filling the queue: %v", err)
	}
	time.Sleep(timeout + 300*time.Millisecond) // idle: nothing to confirm

	const healthy, workers = 3000, 30
	start := make(chan struct{})
	var wg sync.WaitGroup
	var nackErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		nackErr = one("nacked")
	}()
	results := make([][]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]Message, healthy/workers)
			for i := range msgs {
				id := strconv.Itoa(w) + "-" + strconv.Itoa(i)
				msgs[i] = Message{Exchange: ok, RoutingKey: "k", Body: []byte(id), MessageID: id, DueMs: 1}
			}
			<-start
			time.Sleep(time.Millisecond) // after the nacked one, mostly
			results[w] = p.Publish(context.Background(), msgs)
		}()
	}
	close(start)
	wg.Wait()

	if Kind(nackErr) != "nack" {
		t.Errorf("publish to the full queue: %v, want a nack", nackErr)
	}
	kinds := map[string]int{}
	for _, errs := range results {
		for _, err := range errs {
			kinds[Kind(err)]++
		}
	}
	if kinds["confirmed"] != healthy {
		t.Errorf("healthy publishes: %v, want all %d confirmed", kinds, healthy)
	}
	if now, _ := p.session(); now != s {
		t.Errorf("the connection was replaced (now on %q): %v", p.State().Node, s.gaveUp.Load())
	}
	if n := testutil.ToFloat64(p.opt.Metrics.switches); n != 0 {
		t.Errorf("node switches = %v, want 0", n)
	}
}
