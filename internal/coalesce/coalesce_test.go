package coalesce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// pipelineCounter counts the pipelines a client sends.
type pipelineCounter struct{ n atomic.Int64 }

func (c *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestCallersOfOneMomentShareARoundTrip: requests that come within the
// window go out in one pipeline, and each caller gets its own results and
// errors, one caller's bad command failing no other's.
func TestCallersOfOneMomentShareARoundTrip(t *testing.T) {
	rdb := testenv.Redis(t)
	key := testenv.Name(t)
	testenv.CleanRedis(t, rdb, key)
	count := &pipelineCounter{}
	rdb.AddHook(count)
	ctx := context.Background()
	if err := rdb.Set(ctx, key+":str", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	c := New(rdb, 20*time.Millisecond, 3*time.Second)
	defer c.Close()
	before := count.n.Load()

	const callers = 50
	var wg sync.WaitGroup
	errs := make([]error, callers)
	vals := make([]int64, callers)
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var incr *redis.IntCmd
			var bad *redis.ZSliceCmd
			sent, took, err := c.Do(ctx, "", func(pipe redis.Pipeliner) {
				incr = pipe.IncrBy(ctx, fmt.Sprintf("%s:n%d", key, i), int64(i))
				if i%10 == 0 { // a sorted-set read of a string: WRONGTYPE
					bad = pipe.ZRangeWithScores(ctx, key+":str", 0, 0)
				}
			})
			if err != nil || sent < 0 || took <= 0 {
				errs[i] = fmt.Errorf("sent %v, took %v, %v", sent, took, err)
				return
			}
			vals[i], errs[i] = incr.Result()
			if bad != nil && bad.Err() == nil {
				errs[i] = fmt.Errorf("ZRANGE of a string answered %v", bad.Val())
			}
		}()
	}
	wg.Wait()
	for i := 0; i < callers; i++ {
		if errs[i] != nil || vals[i] != int64(i) {
			t.Errorf("caller %d: %d, %v", i, vals[i], errs[i])
		}
	}
	// All 50 started together; a slow scheduler may split them, not into 50.
	if n := count.n.Load() - before; n > 5 {
		t.Errorf("%d callers took %d round trips", callers, n)
	} else {
		t.Logf("%d callers, %d round trip(s)", callers, n)
	}

	// Later callers get a round trip of their own: none waits forever.
	_, _, _ = c.Do(ctx, "", func(pipe redis.Pipeliner) { pipe.Ping(ctx) })
	_, _, _ = c.Do(ctx, "other", func(pipe redis.Pipeliner) { pipe.Ping(ctx) })
	if n := count.n.Load() - before; n < 3 {
		t.Errorf("%d round trips after two more callers, want at least 3", n)
	}

	// Closed, it ends its goroutines, and a caller still gets an answer.
	c.Close()
	var pong *redis.StatusCmd
	_, _, _ = c.Do(ctx, "", func(pipe redis.Pipeliner) { pong = pipe.Ping(ctx) })
	if pong.Val() != "PONG" {
		t.Errorf("after Close: %v", pong.Err())
	}
}

// A caller queued behind a round trip to a primary that stopped answering
// gives up when its own context ends, not after that round trip's timeout
// and its own.
func TestCallerGivesUpWithItsContext(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	c := New(rdb, 0, 3*time.Second)
	defer c.Close()
	srv.Pause()
	defer srv.Resume()
	ctx := context.Background()
	first := make(chan struct{})
	go func() {
		defer close(first)
		_, _, _ = c.Do(ctx, "", func(pipe redis.Pipeliner) { pipe.Ping(ctx) }) // hangs until the timeout
	}()
	time.Sleep(100 * time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, _, err := c.Do(short, "", func(pipe redis.Pipeliner) { pipe.Ping(ctx) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do behind a hung round trip: %v, want the caller's deadline", err)
	}
	if waited := time.Since(began); waited > 2*time.Second {
		t.Errorf("Do waited %v with a 200ms context", waited)
	}
	srv.Resume()
	<-first
}

// A lane unused for a while ends, and a later caller gets a new one.
func TestUnusedLaneEnds(t *testing.T) {
	c := New(testenv.Redis(t), 0, 3*time.Second)
	c.idle = 50 * time.Millisecond
	defer c.Close()
	ctx := context.Background()
	ping := func() {
		var pong *redis.StatusCmd
		if _, _, err := c.Do(ctx, "gone", func(pipe redis.Pipeliner) { pong = pipe.Ping(ctx) }); err != nil || pong.Val() != "PONG" {
			t.Fatalf("Do: %v, %v", err, pong.Err())
		}
	}
	lanes := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.lanes)
	}
	ping()
	deadline := time.Now().Add(5 * time.Second)
	for lanes() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := lanes(); n != 0 {
		t.Fatalf("%d lanes left after they went unused", n)
	}
	ping()
}
