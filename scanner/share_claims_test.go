package scanner

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/liveness"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// claimCounter counts the claim script's runs that may take tasks (limit
// above 0; sweeps claim 0).
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *claimCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}
func (c *claimCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *claimCounter) count(cmd redis.Cmder) {
	a := cmd.Args()
	if len(a) < 4 || !strings.EqualFold(fmt.Sprint(a[0]), "evalsha") || fmt.Sprint(a[1]) != claimScript.Hash() {
		return
	}
	nk, err := strconv.Atoi(fmt.Sprint(a[2]))
	if err != nil || len(a) <= 3+nk {
		return
	}
	if limit, err := strconv.Atoi(fmt.Sprint(a[3+nk])); err == nil && limit > 0 {
		c.n.Add(1)
	}
}

// claimsPerTask runs n instances (each with its own liveness) on one
// queue of 8 shards, schedules one task every 50 ms (with wake-ups) for
// about 4 s, and returns the claims that could take tasks per task
// delivered.
func claimsPerTask(t *testing.T, n int) float64 {
	prefix := testenv.Name(t)
	base := testenv.Redis(t)
	testenv.CleanRedis(t, base, prefix)
	conn := testenv.AMQP(t)
	exchange := prefix + ".q"
	got := testenv.Consumer(t, conn, exchange, "q")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var claims claimCounter
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: base.Options().Addr})
		t.Cleanup(func() { rdb.Close() })
		rdb.AddHook(&claims)
		pub := publisher.New(publisher.Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{exchange}, ConfirmTimeout: 5 * time.Second})
		id := NewInstanceID()
		lv := liveness.New(rdb, liveness.Options{Prefix: prefix, ID: id, Queues: []string{"q"}})
		s := New(rdb, pub, Options{Queue: "q", Shards: 8, Exchange: exchange, RoutingKey: "q", KeyPrefix: prefix,
			BatchSize: 100, Pipeline: 4, PollInterval: 50 * time.Millisecond, IdlePollInterval: 500 * time.Millisecond,
			Lease: 30 * time.Second, Lookahead: time.Second, ShutdownTimeout: time.Second, MaxMessageBytes: 1 << 20,
			MaxAttempts: 5, RetryMin: time.Second, RetryMax: time.Minute, InstanceID: id, Liveness: lv})
		wg.Add(3)
		go func() { defer wg.Done(); _ = pub.Run(ctx) }()
		go func() { defer wg.Done(); _ = lv.Run(ctx) }()
		go func() { defer wg.Done(); _ = s.Run(ctx) }()
	}
	time.Sleep(2 * time.Second) // heartbeats: every instance knows the others
	prod, err := shard.NewProducer(base, prefix, "q", 8)
	if err != nil {
		t.Fatal(err)
	}
	start := claims.n.Load()
	const tasks = 80
	for i := range tasks {
		if err := prod.Schedule(ctx, []byte(fmt.Sprint("t", i)), time.Now().Add(200*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	seen := map[string]bool{}
	for deadline := time.After(30 * time.Second); len(seen) < tasks; {
		select {
		case d := <-got:
			seen[string(d.Body)] = true
		case <-deadline:
			t.Fatalf("%d of %d tasks delivered", len(seen), tasks)
		}
	}
	return float64(claims.n.Load()-start) / tasks
}

// TestSharedClaimsPerTask: with steady work shared by three instances, a
// wake-up makes only the instance whose share holds the shard claim it,
// not every instance: claims per task stay near one instance's.
func TestSharedClaimsPerTask(t *testing.T) {
	one := claimsPerTask(t, 1)
	three := claimsPerTask(t, 3)
	t.Logf("claims per task (one task every 50 ms): one instance %.2f, three instances %.2f", one, three)
	if three > 1.5*one {
		t.Errorf("three instances made %.2f claims per task against one instance's %.2f: every instance claims on every wake-up", three, one)
	}
}
