package publisher

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// A TCP fault proxy run inside the test process (Shopify's toxiproxy,
// embedded), as in tests/netproxy_test.go: the publisher connects through
// it, the test's own clients connect to the broker directly.
var (
	proxyServerOnce sync.Once
	proxyServer     *toxiproxy.ApiServer
)

// proxyLeaks are the proxy's own goroutines, which may outlive a link
// whose far end failed; they belong to the tooling, not the code under test.
var proxyLeaks = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).RemoveToxic.func1"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*Proxy).Stop"),
}

type netProxy struct {
	t *testing.T
	p *toxiproxy.Proxy
	n int
}

// newNetProxy starts a proxy on a free 127.0.0.1 port in front of server
// (host:port); it stops when the test ends.
func newNetProxy(t *testing.T, server string) *netProxy {
	t.Helper()
	proxyServerOnce.Do(func() {
		proxyServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	})
	p := toxiproxy.NewProxy(proxyServer, testenv.Name(t), "127.0.0.1:0", server)
	if err := p.Start(); err != nil {
		t.Fatalf("start fault proxy to %s: %v", server, err)
	}
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { defer close(done); p.Stop() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Logf("fault proxy to %s did not stop within 5s; leaving it", server)
		}
	})
	return &netProxy{t: t, p: p}
}

// url returns raw with its host:port replaced by the proxy's.
func (np *netProxy) url(raw string) string {
	np.t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		np.t.Fatalf("parse %s: %v", raw, err)
	}
	np.p.Lock()
	u.Host = np.p.Listen
	np.p.Unlock()
	return u.String()
}

// toxic adds a toxic of type typ with attrs on stream ("upstream" is
// client to broker, "downstream" broker to client).
func (np *netProxy) toxic(typ, stream string, attrs map[string]int64) {
	np.t.Helper()
	np.n++
	body, err := json.Marshal(map[string]any{
		"name": fmt.Sprintf("%s-%s-%d", typ, stream, np.n), "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		np.t.Fatal(err)
	}
	if _, err := np.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		np.t.Fatalf("add %s toxic: %v", typ, err)
	}
}
