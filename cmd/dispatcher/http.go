package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/publisher"
)

type httpServer struct {
	srv  *http.Server
	done chan struct{}
}

// startHTTP serves /healthz (the process runs), /readyz (Redis and the
// broker are reachable, and Redis runs the scripts) and /metrics.
// refusals says why Redis refuses the scripts, if it does: a read-only
// replica answers PING, so only the scripts' answers tell.
func startHTTP(addr string, reg *prometheus.Registry, rdb redis.UniversalClient, pub *publisher.Publisher, refusals func() []string, log *slog.Logger) (*httpServer, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		var problems []string
		if down := unreachablePrimaries(ctx, rdb); len(down) > 0 {
			problems = append(problems, down...)
		} else {
			for _, why := range refusals() {
				problems = append(problems, "redis: refuses the dispatcher's scripts: "+why)
			}
		}
		switch {
		case pub.Blocked():
			problems = append(problems, "broker: blocking publishes (memory or disk alarm)")
		case !pub.Ready():
			problems = append(problems, "broker: not connected")
		}
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, p := range problems {
				fmt.Fprintln(w, p)
			}
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

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
	h := &httpServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	log.Info("serving /healthz, /readyz and /metrics", "addr", ln.Addr().String())
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
