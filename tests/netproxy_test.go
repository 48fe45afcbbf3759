package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// The proxies of all tests share one toxiproxy server object; it only
// carries the logger and metrics, nothing listens for its HTTP API.
var (
	proxyServerOnce sync.Once
	proxyServer     *toxiproxy.ApiServer
)

func init() {
	// Registered before any proxy exists: a proxy sizes its toxic chains
	// by the number of registered toxic types.
	toxics.Register("gate", new(gateToxic))
}

// netProxyLeaks tells goleak to ignore the fault proxy's own goroutines.
// When one end of a toxiproxy link fails while the other still sends, the
// link's reader and toxics stay blocked on its internal channels (its noop
// toxic sends without watching for interrupts), even after the proxy
// stops. They belong to the test's tooling, not to the code under test.
var netProxyLeaks = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).RemoveToxic.func1"),
	// A cleanup that gave up waiting (see newNetProxy).
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*Proxy).Stop"),
}

// gate is an open/shut switch shared by the gate toxics of one proxy.
type gate struct {
	mu      sync.Mutex
	shut    bool
	changed chan struct{} // closed and replaced on every change
}

func (g *gate) state() (shut bool, changed <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut, g.changed
}

func (g *gate) set(shut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = shut
	close(g.changed)
	g.changed = make(chan struct{})
}

// gates maps a gate toxic's "gate" attribute to its gate: toxiproxy builds
// toxics from JSON, so they find their switch by number.
var (
	gates    sync.Map // int64 -> *gate
	gateSeen atomic.Int64
)

// gateToxic passes data through while its gate is open and holds it,
// reading nothing more, while it is shut: a stall with back pressure (the
// sender's socket buffers fill and its writes block) after which the
// connection carries on. (The built-in timeout toxic drops data instead,
// which is a half-open connection, not a stall.) It sits first in each
// chain for the proxy's whole life and is switched rather than added and
// removed: removing a toxic makes toxiproxy flush the held data under its
// global lock, waiting 5s on each connection whose far end has gone,
// which would hold up the new connections the test wants to see.
type gateToxic struct {
	Gate int64 `json:"gate"`
}

// gateState keeps a chunk taken in but not yet passed on across
// interruptions (when another toxic is added behind this one).
type gateState struct{ pending *stream.StreamChunk }

func (*gateToxic) NewState() any { return new(gateState) }

func (t *gateToxic) Pipe(stub *toxics.ToxicStub) {
	g, ok := gates.Load(t.Gate)
	if !ok { // the proxy's test is over
		new(toxics.NoopToxic).Pipe(stub)
		return
	}
	st := stub.State.(*gateState)
	for {
		shut, changed := g.(*gate).state()
		if shut {
			select {
			case <-stub.Interrupt:
				return
			case <-changed:
			}
			continue
		}
		if st.pending != nil {
			select {
			case <-stub.Interrupt:
				return
			case <-changed:
			case stub.Output <- st.pending:
				st.pending = nil
			}
			continue
		}
		select {
		case <-stub.Interrupt:
			return
		case <-changed:
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			st.pending = c
		}
	}
}

// netProxy is a TCP fault proxy run inside the test process (Shopify's
// toxiproxy, embedded) between the dispatcher and one server. The
// dispatcher connects through it; the test's producer and consumer
// connect to the server directly.
type netProxy struct {
	t    testing.TB
	p    *toxiproxy.Proxy
	gate *gate

	mu sync.Mutex
	n  int // names new toxics
}

// newNetProxy starts a proxy on a free 127.0.0.1 port in front of server
// (host:port). It stops when the test ends.
func newNetProxy(t testing.TB, server string) *netProxy {
	t.Helper()
	proxyServerOnce.Do(func() {
		proxyServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	})
	p := toxiproxy.NewProxy(proxyServer, testenv.Name(t), "127.0.0.1:0", server)
	np := &netProxy{t: t, p: p, gate: &gate{changed: make(chan struct{})}}
	id := gateSeen.Add(1)
	gates.Store(id, np.gate)
	np.toxic("gate", map[string]int64{"gate": id}, bothWays...)
	if err := p.Start(); err != nil {
		t.Fatalf("start fault proxy to %s: %v", server, err)
	}
	t.Cleanup(func() {
		// Stopping closes every connection; it can block behind a link
		// whose far end has gone, so the test does not wait forever.
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.Stop()
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Logf("fault proxy to %s did not stop within 5s; leaving it", server)
		}
		gates.Delete(id)
	})
	return np
}

// addr is where the proxy listens.
func (np *netProxy) addr() string {
	np.p.Lock()
	defer np.p.Unlock()
	return np.p.Listen
}

// url returns raw (a redis:// or amqp:// URL of the upstream) with its
// host:port replaced by the proxy's.
func (np *netProxy) url(raw string) string {
	np.t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		np.t.Fatalf("parse %s: %v", raw, err)
	}
	u.Host = np.addr()
	return u.String()
}

// Streams a toxic can act on: upstream is client to server, downstream
// server to client.
const (
	upstream   = "upstream"
	downstream = "downstream"
)

var bothWays = []string{upstream, downstream}

// toxic adds a toxic of type typ with attributes attrs on each of the
// given streams and returns a function that removes them again. It acts
// on existing connections and on every new one until removed. Neither
// may be called from more than one goroutine at a time.
func (np *netProxy) toxic(typ string, attrs map[string]int64, streams ...string) (remove func()) {
	np.t.Helper()
	var names []string
	for _, s := range streams {
		np.mu.Lock()
		np.n++
		name := fmt.Sprintf("%s-%s-%d", typ, s, np.n)
		np.mu.Unlock()
		body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": s, "toxicity": 1.0, "attributes": attrs})
		if err != nil {
			np.t.Fatal(err)
		}
		if _, err := np.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
			np.t.Fatalf("add %s toxic: %v", typ, err)
		}
		names = append(names, name)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, name := range names {
				if err := np.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
					np.t.Errorf("remove toxic %s: %v", name, err)
				}
			}
		})
	}
}

// latency delays every chunk of data by ms ± jitter milliseconds in both
// directions, so a round trip takes about twice that more.
func (np *netProxy) latency(ms, jitter int64) (remove func()) {
	return np.toxic("latency", map[string]int64{"latency": ms, "jitter": jitter}, bothWays...)
}

// stall stops data in both directions without closing anything: nothing
// more is read from either socket, so senders block once the buffers are
// full, and connections opened meanwhile hang too. resume lets the held
// data through in order; the connections carry on.
func (np *netProxy) stall() (resume func()) {
	np.gate.set(true)
	var once sync.Once
	return func() { once.Do(func() { np.gate.set(false) }) }
}

// halfOpen silently drops all data in both directions, without FIN or
// RST: to both ends every connection, old or new, looks alive but never
// answers (toxiproxy's timeout toxic with timeout 0). heal closes the
// connections that were black-holed, as a real peer that forgot them
// would answer their next packet with RST; new ones then work.
func (np *netProxy) halfOpen() (heal func()) {
	return np.toxic("timeout", map[string]int64{"timeout": 0}, bothWays...)
}

// resetPeer closes every connection on its next data after ms
// milliseconds. Connections opened while it is on are reset with RST
// (SO_LINGER 0); toxiproxy can set that only when a connection starts,
// so ones that were already open end with FIN.
func (np *netProxy) resetPeer(ms int64) (remove func()) {
	return np.toxic("reset_peer", map[string]int64{"timeout": ms}, bothWays...)
}

// limitData closes each connection once n bytes went through it in the
// given stream: connections that die again and again.
func (np *netProxy) limitData(n int64, stream string) (remove func()) {
	return np.toxic("limit_data", map[string]int64{"bytes": n}, stream)
}

// cutAll closes every connection through the proxy at once (FIN to both
// ends) and keeps listening for new ones.
func (np *netProxy) cutAll() {
	np.t.Helper()
	np.p.Stop()
	if err := np.p.Start(); err != nil {
		np.t.Fatalf("restart fault proxy: %v", err)
	}
}
