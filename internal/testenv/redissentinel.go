package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions configure StartRedisSentinel; the zero value is master
// "mymaster", quorum 2, down-after 1 s, failover-timeout 5 s.
type SentinelOptions struct {
	MasterName      string        // default "mymaster"
	Quorum          int           // default 2 (of 3 sentinels)
	DownAfter       time.Duration // sentinel down-after-milliseconds, default 1 s
	FailoverTimeout time.Duration // sentinel failover-timeout, default 5 s
	// Args are extra config lines for the primary and the replica.
	Args []string
}

// RedisSentinel is a private primary, its replica and three sentinels
// monitoring them, owned by one test and stopped when it ends.
type RedisSentinel struct {
	t         testing.TB
	opt       SentinelOptions
	servers   []*RedisServer // the primary and the replica at start
	sentinels []*RedisServer

	mu      sync.Mutex
	clients map[string]*redis.Client
}

// StartRedisSentinel starts a primary, a replica of it and three sentinels,
// and waits until every sentinel sees the primary, the replica and the two
// other sentinels.
func StartRedisSentinel(t testing.TB, opt SentinelOptions) *RedisSentinel {
	t.Helper()
	if opt.MasterName == "" {
		opt.MasterName = "mymaster"
	}
	if opt.Quorum == 0 {
		opt.Quorum = 2
	}
	if opt.DownAfter == 0 {
		opt.DownAfter = time.Second
	}
	if opt.FailoverTimeout == 0 {
		opt.FailoverTimeout = 5 * time.Second
	}
	rs := &RedisSentinel{t: t, opt: opt, clients: map[string]*redis.Client{}}
	t.Cleanup(rs.closeClients)
	common := []string{"repl-diskless-sync yes", "repl-diskless-sync-delay 0", "repl-ping-replica-period 1"}
	primary := StartRedis(t, RedisOptions{Args: append(append([]string{}, common...), opt.Args...)})
	replica := StartRedis(t, RedisOptions{Args: append(append(common, "replicaof 127.0.0.1 "+strconv.Itoa(primary.Port)), opt.Args...)})
	rs.servers = []*RedisServer{primary, replica}
	// A sentinel learns of replicas from the primary's INFO, which it asks
	// every 10 s after the first time: have the replica attached before.
	rs.wait(20*time.Second, func(ctx context.Context) error {
		info, err := rs.admin(replica).Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if st := redisInfoField(info, "master_link_status"); st != "up" {
			return fmt.Errorf("replica %s: master_link_status:%s", replica.Addr(), st)
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		rs.sentinels = append(rs.sentinels, StartRedis(t, RedisOptions{Sentinel: true, Args: []string{
			"sentinel resolve-hostnames no",
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", opt.MasterName, primary.Port, opt.Quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", opt.MasterName, opt.DownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", opt.MasterName, opt.FailoverTimeout.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", opt.MasterName),
		}}))
	}
	rs.wait(20*time.Second, func(ctx context.Context) error {
		for _, s := range rs.sentinels {
			c := rs.admin(s)
			reps, err := c.Do(ctx, "SENTINEL", "REPLICAS", opt.MasterName).Slice()
			if err != nil {
				return fmt.Errorf("SENTINEL REPLICAS on %s: %w", s.Addr(), err)
			}
			if len(reps) == 0 {
				return fmt.Errorf("sentinel %s sees no replica", s.Addr())
			}
			others, err := c.Do(ctx, "SENTINEL", "SENTINELS", opt.MasterName).Slice()
			if err != nil {
				return fmt.Errorf("SENTINEL SENTINELS on %s: %w", s.Addr(), err)
			}
			if len(others) != 2 {
				return fmt.Errorf("sentinel %s sees %d other sentinels", s.Addr(), len(others))
			}
		}
		return nil
	})
	return rs
}

// URL is redis+sentinel://127.0.0.1:s1?addr=127.0.0.1:s2&addr=127.0.0.1:s3&master_name=mymaster.
func (rs *RedisSentinel) URL() string {
	return fmt.Sprintf("redis+sentinel://%s?addr=%s&addr=%s&master_name=%s",
		rs.sentinels[0].Addr(), rs.sentinels[1].Addr(), rs.sentinels[2].Addr(), rs.opt.MasterName)
}

// MasterName is the name the sentinels monitor the primary under.
func (rs *RedisSentinel) MasterName() string { return rs.opt.MasterName }

// Sentinels returns the three sentinel processes.
func (rs *RedisSentinel) Sentinels() []*RedisServer {
	return append([]*RedisServer(nil), rs.sentinels...)
}

// Servers returns the two data servers, the primary at start first.
func (rs *RedisSentinel) Servers() []*RedisServer {
	return append([]*RedisServer(nil), rs.servers...)
}

// Primary returns the data server the first answering sentinel names as
// master now (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (rs *RedisSentinel) Primary() *RedisServer {
	rs.t.Helper()
	addr, err := rs.masterAddr(context.Background())
	if err != nil {
		rs.t.Fatal(err)
	}
	for _, s := range rs.servers {
		if s.Addr() == addr {
			return s
		}
	}
	rs.t.Fatalf("sentinels name %s as master, not one of ours", addr)
	return nil
}

// Replica returns the data server that is not Primary (after KillPrimary
// and a failover, that is the dead old primary).
func (rs *RedisSentinel) Replica() *RedisServer {
	rs.t.Helper()
	p := rs.Primary()
	if rs.servers[0] == p {
		return rs.servers[1]
	}
	return rs.servers[0]
}

// KillPrimary kills the current primary with SIGKILL and returns it.
func (rs *RedisSentinel) KillPrimary() *RedisServer {
	rs.t.Helper()
	p := rs.Primary()
	p.Kill()
	return p
}

// WaitFailover waits until every live sentinel names a master other than
// oldAddr and that server answers ROLE as master; it returns that server.
func (rs *RedisSentinel) WaitFailover(oldAddr string, timeout time.Duration) *RedisServer {
	rs.t.Helper()
	var addr string
	rs.wait(timeout, func(ctx context.Context) error {
		addr = ""
		for _, s := range rs.sentinels {
			if !serverLive(s) {
				continue
			}
			a, err := rs.admin(s).Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", rs.opt.MasterName).StringSlice()
			if err != nil || len(a) != 2 {
				return fmt.Errorf("GET-MASTER-ADDR-BY-NAME on %s: %v %v", s.Addr(), a, err)
			}
			got := net.JoinHostPort(a[0], a[1])
			if got == oldAddr {
				return fmt.Errorf("sentinel %s still names %s", s.Addr(), oldAddr)
			}
			if addr != "" && got != addr {
				return fmt.Errorf("sentinels disagree: %s and %s", addr, got)
			}
			addr = got
		}
		role, err := redisRole(ctx, rs.adminAddr(addr))
		if err != nil {
			return err
		}
		if role != "master" {
			return fmt.Errorf("%s is %s, not yet master", addr, role)
		}
		return nil
	})
	for _, s := range rs.servers {
		if s.Addr() == addr {
			return s
		}
	}
	rs.t.Fatalf("sentinels name %s as master, not one of ours", addr)
	return nil
}

// Client returns a new failover client (redis.NewFailoverClient) of the
// master, closed when the test ends.
func (rs *RedisSentinel) Client() *redis.Client {
	addrs := make([]string, len(rs.sentinels))
	for i, s := range rs.sentinels {
		addrs[i] = s.Addr()
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: rs.opt.MasterName, SentinelAddrs: addrs})
	rs.t.Cleanup(func() { c.Close() })
	return c
}

func (rs *RedisSentinel) masterAddr(ctx context.Context) (string, error) {
	var lastErr error
	for _, s := range rs.sentinels {
		if !serverLive(s) {
			continue
		}
		a, err := rs.admin(s).Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", rs.opt.MasterName).StringSlice()
		if err == nil && len(a) == 2 {
			return net.JoinHostPort(a[0], a[1]), nil
		}
		lastErr = fmt.Errorf("GET-MASTER-ADDR-BY-NAME on %s: %v %v", s.Addr(), a, err)
	}
	return "", fmt.Errorf("no sentinel names the master: %v", lastErr)
}

func redisRole(ctx context.Context, c *redis.Client) (string, error) {
	role, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return "", fmt.Errorf("ROLE: %w", err)
	}
	if len(role) == 0 {
		return "", fmt.Errorf("empty ROLE reply")
	}
	r, _ := role[0].(string)
	return r, nil
}

func (rs *RedisSentinel) admin(s *RedisServer) *redis.Client { return rs.adminAddr(s.Addr()) }

func (rs *RedisSentinel) adminAddr(addr string) *redis.Client {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	c := rs.clients[addr]
	if c == nil {
		c = redis.NewClient(&redis.Options{
			Addr: addr, MaxRetries: -1, PoolSize: 4,
			DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second,
		})
		rs.clients[addr] = c
	}
	return c
}

func (rs *RedisSentinel) closeClients() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, c := range rs.clients {
		c.Close()
	}
	rs.clients = nil
}

// wait polls cond until it holds, failing the test with the logs after
// timeout.
func (rs *RedisSentinel) wait(timeout time.Duration, cond func(ctx context.Context) error) {
	rs.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := cond(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			rs.t.Fatalf("redis sentinel set-up: %v after %s\n%s", err, timeout, rs.logTails())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (rs *RedisSentinel) logTails() string {
	var b strings.Builder
	for _, s := range append(append([]*RedisServer{}, rs.servers...), rs.sentinels...) {
		fmt.Fprintf(&b, "--- %s log:\n%s\n", s.Addr(), s.LogTail(1500))
	}
	return b.String()
}
