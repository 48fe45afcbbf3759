// Package redisconn turns DISPATCHER_REDIS_URL into a go-redis client. The
// URL's scheme picks the mode: one server, Redis Cluster or Sentinel. The
// URLs are parsed by go-redis's own parsers; only the scheme's "+cluster"
// or "+sentinel" is taken off first, since go-redis reads those modes from
// plain redis:// URLs.
package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Mode is how the dispatcher reaches Redis.
type Mode string

const (
	Single   Mode = "single"   // redis://, rediss://
	Cluster  Mode = "cluster"  // redis+cluster://, rediss+cluster://
	Sentinel Mode = "sentinel" // redis+sentinel://, rediss+sentinel://
)

// Options are the parsed settings of one of the three modes; exactly one
// of the option pointers is set.
type Options struct {
	Mode     Mode
	single   *redis.Options
	cluster  *redis.ClusterOptions
	failover *redis.FailoverOptions
}

// Schemes lists the accepted URL schemes, for messages.
const Schemes = "redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"

// Parse parses a Redis URL of any mode. Errors may quote parts of the URL:
// callers redact them.
func Parse(raw string) (*Options, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("no scheme; want %s", Schemes)
	}
	base, mode, _ := strings.Cut(strings.ToLower(scheme), "+")
	if base != "redis" && base != "rediss" {
		return nil, fmt.Errorf("scheme %q: want %s", scheme, Schemes)
	}
	plain := base + "://" + rest
	switch mode {
	case "":
		o, err := redis.ParseURL(plain)
		if err != nil {
			return nil, err
		}
		return &Options{Mode: Single, single: o}, nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain)
		if err != nil {
			return nil, err
		}
		return &Options{Mode: Cluster, cluster: o}, nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, errors.New("master_name= is required with Sentinel (the name the sentinels monitor the primary under)")
		}
		return &Options{Mode: Sentinel, failover: o}, nil
	default:
		return nil, fmt.Errorf("scheme %q: want %s", scheme, Schemes)
	}
}

// TLS reports whether the URL asks for TLS (a rediss scheme).
func TLS(raw string) bool { return strings.HasPrefix(strings.ToLower(raw), "rediss") }

// TLSConfig is the TLS configuration the URL set up (nil without TLS).
func (o *Options) TLSConfig() *tls.Config {
	switch o.Mode {
	case Cluster:
		return o.cluster.TLSConfig
	case Sentinel:
		return o.failover.TLSConfig
	}
	return o.single.TLSConfig
}

// SetTLSConfig replaces the TLS configuration (e.g. with the one built from
// DISPATCHER_REDIS_*_FILE); in Sentinel mode it is used for the sentinels
// and for the primary alike.
func (o *Options) SetTLSConfig(c *tls.Config) {
	switch o.Mode {
	case Cluster:
		o.cluster.TLSConfig = c
	case Sentinel:
		o.failover.TLSConfig = c
	default:
		o.single.TLSConfig = c
	}
}

// SetDefaultTimeouts sets how soon a call gives up, unless the URL says
// (read_timeout, write_timeout, max_retries). Every call of the dispatcher
// is a short script or pipeline, and its loops retry failures themselves,
// with backoff and a log line. go-redis's defaults (5s read timeout, 3
// retries of its own) kept the loop waiting about 20s on a connection that
// had silently died before anything was logged or retried; these notice it
// in about 6s.
func (o *Options) SetDefaultTimeouts() {
	set := func(read *time.Duration, retries *int) {
		if *read == 0 {
			*read = 3 * time.Second // the write timeout follows it
		}
		if *retries == 0 {
			*retries = 1 // one quick retry for a connection that broke while idle
		}
	}
	switch o.Mode {
	case Cluster:
		set(&o.cluster.ReadTimeout, &o.cluster.MaxRetries)
	case Sentinel:
		set(&o.failover.ReadTimeout, &o.failover.MaxRetries)
	default:
		set(&o.single.ReadTimeout, &o.single.MaxRetries)
	}
}

// Addrs are the addresses the URL names: the server, the cluster's seed
// nodes or the sentinels.
func (o *Options) Addrs() []string {
	switch o.Mode {
	case Cluster:
		return o.cluster.Addrs
	case Sentinel:
		return o.failover.SentinelAddrs
	}
	return []string{o.single.Addr}
}

// NewClient returns the client of the mode: *redis.Client for one server
// and for Sentinel (which follows promotions), *redis.ClusterClient for a
// cluster. Its calls end at their context's deadline
// (ContextTimeoutEnabled): the scan loop bounds each call to a primary, so
// that one that stopped answering holds up nothing for long, which the
// read timeout alone would not do (go-redis repeats a timed-out call on
// its retries and, on a cluster, its redirects).
func (o *Options) NewClient() redis.UniversalClient {
	switch o.Mode {
	case Cluster:
		o.cluster.ContextTimeoutEnabled = true
		return redis.NewClusterClient(o.cluster)
	case Sentinel:
		o.failover.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(o.failover)
	}
	o.single.ContextTimeoutEnabled = true
	return redis.NewClient(o.single)
}

// Open parses raw, applies the default timeouts and returns a client.
func Open(raw string) (redis.UniversalClient, error) {
	o, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	o.SetDefaultTimeouts()
	return o.NewClient(), nil
}

// ForEachPrimary runs f on a client of every primary: each master of a
// cluster, or the one server (Sentinel: the current primary).
func ForEachPrimary(ctx context.Context, rdb redis.UniversalClient, f func(ctx context.Context, addr string, c *redis.Client) error) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return f(ctx, c.Options().Addr, c)
		})
	}
	if c, ok := rdb.(*redis.Client); ok {
		return f(ctx, c.Options().Addr, c)
	}
	return fmt.Errorf("redis client of type %T", rdb)
}

// NodeOf returns the address of the primary that holds key: "" for a single
// server or Sentinel (one primary), and for a cluster whose slot map is not
// known yet.
func NodeOf(ctx context.Context, rdb redis.UniversalClient, key string) string {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// GlobEscape escapes the characters Redis's pattern matching (SCAN MATCH,
// PSUBSCRIBE) reads as a pattern. Byte by byte: Redis matches bytes, and
// a byte that is not UTF-8 must not become U+FFFD.
func GlobEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
