package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/monitor"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/internal/statuspage"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/scanner"
)

type httpServer struct {
	srv  *http.Server
	done chan struct{}
}

// status is what the HTTP endpoint reports on.
type status struct {
	reg      *prometheus.Registry
	rdb      redis.UniversalClient
	pub      *publisher.Publisher
	mon      *monitor.Monitor
	refusals func() []string // why Redis refuses the scripts, if it does
	boot     *startup        // what the start waits for, until it is over
	counts   *countSampler   // published and errors per queue, sampled
	// failures say why publishes failed lately and were kept for retry,
	// per queue ("queue orders: publishes fail, ...").
	failures func() []string
	// recurring reads the served queues' recurring schedules.
	recurring func(context.Context) []statuspage.Recurring
	// fleet reads the records of the instances serving the queues: the
	// queues as a whole.
	fleet *fleet
	// ingress holds the queues' AMQP ingresses; stallAfter is how long
	// one may not consume, or a message wait, before /readyz says so.
	ingress    *ingressSet
	stallAfter time.Duration
	page       statuspage.Data // the page's fixed part: instance, URLs, ...
}

// startHTTP serves /healthz (the process runs), /readyz (Redis and the
// broker are reachable, Redis runs the scripts, no queue stalled, the
// start is over), /metrics and the status page at /. refusals say why
// Redis refuses the scripts, if it does: a read-only replica answers PING,
// so only the scripts' answers tell. It is called before the start waits
// for Redis, so that all of them answer from the first moment.
//
// Publishes failing for a cause (no queue bound, nacks, refusals) are
// named in /readyz's body at once but make it 503 only once their tasks
// stall the queue (STALL_AFTER): every instance sees the same
// consumer-side cause, so failing readiness at once would take them all
// out of service together, and flap with a consumer redeploying its
// queue, while none is more ready than another.
//
// With token set, the status page and /metrics require it (protect);
// the probes stay open.
func startHTTP(addr, token string, st status, log *slog.Logger) (*httpServer, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		// The queues as a whole are read meanwhile: a Redis that does not
		// answer holds /readyz up once, not twice.
		whole := make(chan []string, 1)
		go func() { whole <- st.wholeLines(ctx) }()
		broker := st.pub.State()
		problems := st.problems(ctx, broker)
		problems = append(problems, st.mon.Stalls()...)
		if p := st.boot.problem(); p != "" {
			problems = append(problems, p)
		}
		var failures []string
		if st.failures != nil {
			failures = st.failures()
		}
		// An ingress not consuming makes it 503, one behind is named only
		// (ingress.Status.Readiness).
		notReady, behind := st.ingress.readiness(st.stallAfter)
		problems = append(problems, notReady...)
		failures = append(failures, behind...)
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, p := range append(append(problems, failures...), <-whole...) {
				fmt.Fprintln(w, p)
			}
			return
		}
		fmt.Fprintln(w, "ready")
		fmt.Fprintln(w, "broker: connected to node", broker.Node)
		for _, f := range append(failures, <-whole...) {
			fmt.Fprintln(w, f)
		}
	})
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the status page is read-only", http.StatusMethodNotAllowed)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		var buf bytes.Buffer
		if err := statuspage.Render(&buf, st.pageData(ctx)); err != nil {
			log.Error("status page", "err", err)
			http.Error(w, "cannot render the status page", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(buf.Bytes())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(st.reg, promhttp.HandlerOpts{Registry: st.reg}))

	network, bind, loopback, err := listenAddr(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen(network, bind)
	if err != nil {
		return nil, fmt.Errorf("listen on DISPATCHER_HTTP_ADDR=%s: %w", addr, err)
	}
	if loopback {
		log.Info("DISPATCHER_HTTP_ADDR names no host: serving on 127.0.0.1 only; give one, e.g. 0.0.0.0, to serve other machines",
			"DISPATCHER_HTTP_ADDR", addr)
	}
	h := &httpServer{srv: &http.Server{Handler: protect(token, mux), ReadHeaderTimeout: 5 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("serving /healthz, /readyz, /metrics and the status page at /", "addr", ln.Addr().String())
	return h, nil
}

func (h *httpServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	<-h.done
}

// listenAddr is where the endpoint listens. An address without a host
// (":9090") would bind every interface and expose the metrics to the
// network by accident, so it means loopback only; a host given explicitly,
// 0.0.0.0 and [::] included, is used as it is. An IPv4 address listens on
// IPv4 only: Go would serve 0.0.0.0 on IPv6 too.
func listenAddr(addr string) (network, bind string, loopback bool, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", false, fmt.Errorf("DISPATCHER_HTTP_ADDR=%q: want host:port or :port: %w", addr, err)
	}
	if host == "" {
		return "tcp4", net.JoinHostPort("127.0.0.1", port), true, nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() != nil {
		return "tcp4", addr, false, nil
	}
	return "tcp", addr, false, nil
}

// unreachablePrimaries names the Redis primaries that do not answer PING
// before ctx ends. On a cluster each is asked: the shards of one that is
// down wait while the others dispatch, and /readyz says which. go-redis
// waits for its read timeout whatever ctx says, so a primary that stopped
// answering (paused, partitioned) is given up on here, not there.
func unreachablePrimaries(ctx context.Context, rdb redis.UniversalClient) []string {
	var mu sync.Mutex
	asked := map[string]bool{} // addr -> answered
	var down []string
	finished := make(chan error, 1)
	go func() {
		finished <- redisconn.ForEachPrimary(ctx, rdb, func(ctx context.Context, addr string, c *redis.Client) error {
			mu.Lock()
			asked[addr] = false
			mu.Unlock()
			err := c.Ping(ctx).Err()
			mu.Lock()
			defer mu.Unlock()
			asked[addr] = true
			if err != nil {
				down = append(down, primaryProblem(rdb, addr, "unreachable"))
			}
			return nil
		})
	}()
	var err error
	select {
	case err = <-finished:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	for addr, answered := range asked {
		if !answered {
			down = append(down, primaryProblem(rdb, addr, "not answering"))
		}
	}
	if len(asked) == 0 && (err != nil || ctx.Err() != nil) {
		down = append(down, "redis: unreachable")
	}
	sort.Strings(down)
	return slices.Compact(down)
}

func primaryProblem(rdb redis.UniversalClient, addr, what string) string {
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		return "redis: " + what
	}
	return "redis: primary " + addr + " " + what + " (its shards wait)"
}

// publishFailures lists, per queue, why its publishes failed lately and
// were kept for retry, for /readyz.
func publishFailures(scs []*scanner.Queue) func() []string {
	return func() []string {
		var out []string
		for _, sc := range scs {
			for _, f := range sc.PublishFailures() {
				out = append(out, "queue "+sc.Queue()+": publishes fail, tasks kept for retry: "+f)
			}
		}
		return out
	}
}

// redisProblems lists Redis primaries down or refusing the scripts.
func (st status) redisProblems(ctx context.Context) []string {
	if down := unreachablePrimaries(ctx, st.rdb); len(down) > 0 {
		return down
	}
	var problems []string
	for _, why := range st.refusals() {
		problems = append(problems, "redis: refuses the dispatcher's scripts: "+why)
	}
	return problems
}

// problems lists what keeps the instance from dispatching: Redis primaries
// down or refusing the scripts, the broker not connected or blocking.
func (st status) problems(ctx context.Context, broker publisher.State) []string {
	problems := st.redisProblems(ctx)
	switch {
	case broker.Blocked:
		problems = append(problems, "broker: node "+broker.Node+" blocks publishes (memory or disk alarm)")
	case !broker.Connected:
		problems = append(problems, "broker: not connected (nodes: "+strings.Join(st.pub.Nodes(), ", ")+")")
	}
	return problems
}

// pageData gathers what the status page shows.
func (st status) pageData(ctx context.Context) statuspage.Data {
	d := st.page
	d.Now = time.Now()
	b := st.pub.State()
	d.Broker.Connected, d.Broker.Blocked, d.Broker.Node = b.Connected && !b.Blocked, b.Blocked, b.Node
	d.Redis.Problems = st.redisProblems(ctx)
	if d.Starting = st.boot.problem(); d.Starting != "" {
		return d // no queue is read before the start is over
	}
	d.Queues = st.mon.Views(ctx)
	d.Stalls = st.mon.Stalls()
	d.Lateness = lateness(st.reg)
	d.Ingress = st.ingress.page(st.stallAfter)
	d.Counts = st.counts.counts()
	if st.recurring != nil {
		d.Recurring = st.recurring(ctx)
	}
	if st.fleet != nil {
		d.Whole = st.fleet.read(ctx)
	}
	return d
}

// wholeLines say each queue as a whole for /readyz, once the start is
// over (the records are not written before).
func (st status) wholeLines(ctx context.Context) []string {
	if st.fleet == nil || st.boot.problem() != "" {
		return nil
	}
	return wholeLines(st.fleet.read(ctx), st.page.Instance)
}

// lateness reads this instance's dispatch lateness histogram per queue.
func lateness(reg *prometheus.Registry) map[string][]statuspage.Bucket {
	mfs, err := reg.Gather()
	if err != nil {
		return nil
	}
	out := map[string][]statuspage.Bucket{}
	for _, mf := range mfs {
		if mf.GetName() != "dispatcher_dispatch_lateness_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var queue string
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" {
					queue = l.GetValue()
				}
			}
			h := m.GetHistogram()
			var bs []statuspage.Bucket
			for _, b := range h.GetBucket() {
				bs = append(bs, statuspage.Bucket{UpTo: b.GetUpperBound(), Count: b.GetCumulativeCount()})
			}
			bs = append(bs, statuspage.Bucket{UpTo: math.Inf(1), Count: h.GetSampleCount()})
			out[queue] = bs
		}
	}
	return out
}

// openPaths answer without the token: the probes, which the kubelet and
// load balancers call without credentials, and which say nothing beyond
// ready or not and why.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true}

// protect requires token (DISPATCHER_HTTP_AUTH_TOKEN) for every path but
// the probes: as "Authorization: Bearer <token>", as Prometheus sends it,
// or as the password of basic auth (any user), as a browser asks for it.
// Empty token: no check. The comparison takes the same time whatever the
// guess, and the token is never logged.
func protect(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		var got string
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			got = b
		} else if _, pw, ok := r.BasicAuth(); ok {
			got = pw
		}
		if subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="dispatcher", Basic realm="dispatcher"`)
			http.Error(w, "this instance requires DISPATCHER_HTTP_AUTH_TOKEN (Authorization: Bearer <token>) for all but /healthz and /readyz", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
