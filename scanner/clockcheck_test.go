package scanner

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A claim's reading of the Redis clock is filed under the primary the claim
// was sent to, not under the one the cluster names when its answer comes:
// after a failover in between, a reading of the old primary, whose clock
// may be ahead, would let tasks held for the new one out before its clock
// reaches their due time.
func TestClockReadingFiledUnderThePrimaryItWasSentTo(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis: %v", err)
	}
	s := New(nil, nil, Options{Queue: "q", Shards: 1, KeyPrefix: "p"})
	var mu sync.Mutex
	primary := "A"
	c := newClockCheck(s.clock, func(context.Context, int) (string, redis.Cmdable, error) {
		mu.Lock()
		defer mu.Unlock()
		return primary, rdb, nil // B's clock is the real Redis's
	}, s.lim, s.met)
	defer c.stop()

	heldUs := s.clock.localUs() // a task held before the claim was sent
	before := s.clock.now()
	sentTo := c.primaryOf(0) // the claim goes to A, whose clock is an hour ahead
	mu.Lock()
	primary = "B" // failed over before the answer came
	mu.Unlock()
	c.note(0, time.Now().Add(time.Hour).UnixMicro(), before, sentTo)
	if c.due(0, time.Now().Add(30*time.Minute).UnixMicro(), heldUs) {
		t.Fatal("a task due in 30 min by B's clock let out by A's reading, an hour ahead")
	}
	// A reading filed under the primary it was sent to still counts.
	c.note(0, time.Now().Add(time.Hour).UnixMicro(), s.clock.now(), c.primaryOf(0))
	if !c.due(0, time.Now().Add(30*time.Minute).UnixMicro(), heldUs) {
		t.Fatal("a reading of B sent to B, ahead of the due time, did not confirm it")
	}
}

// Held tasks falling due at many instants within the read gap share one
// TIME each gap, not one each: the instants in between wait for the next
// reading, which is still taken after they were held.
func TestClockReadsAtMostOncePerGap(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis: %v", err)
	}
	var mu sync.Mutex
	var sent []time.Time
	rdb.AddHook(timeHook{func() { mu.Lock(); sent = append(sent, time.Now()); mu.Unlock() }})
	s := New(nil, nil, Options{Queue: "q", Shards: 1, KeyPrefix: "p"})
	c := newClockCheck(s.clock, func(context.Context, int) (string, redis.Cmdable, error) { return "", rdb, nil }, s.lim, s.met)
	c.gap = 100 * time.Millisecond
	defer c.stop()
	// A task held and due every ms for 350 ms, each asked about until a
	// reading confirms it: readings come once per gap.
	type task struct{ dueUs, heldUs int64 }
	var open []task
	begin := time.Now()
	held := 0
	for time.Since(begin) < 350*time.Millisecond {
		held++
		open = append(open, task{s.clock.serverNowUs(0), s.clock.localUs()})
		open = slices.DeleteFunc(open, func(x task) bool { return c.due(0, x.dueUs, x.heldUs) })
		time.Sleep(time.Millisecond)
	}
	confirmed := held - len(open)
	mu.Lock()
	defer mu.Unlock()
	if len(sent) < 2 || len(sent) > 5 {
		t.Fatalf("%d TIMEs in 350 ms with a 100 ms gap; want 3 or 4", len(sent))
	}
	for n := 1; n < len(sent); n++ {
		// (A few ms of slack: the hook runs a little after the send is timed.)
		if d := sent[n].Sub(sent[n-1]); d < 85*time.Millisecond {
			t.Fatalf("TIMEs %d and %d %v apart, under the 100 ms gap", n-1, n, d)
		}
	}
	if confirmed == 0 {
		t.Fatalf("no reading confirmed a task (%d still wait)", len(open))
	}
}

// timeHook calls f for each TIME the client sends.
type timeHook struct{ f func() }

func (timeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h timeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "time" {
			h.f()
		}
		return next(ctx, cmd)
	}
}
func (timeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The readings of one primary's clock come from one goroutine that lives
// while they are asked for, not from a goroutine started for each: under
// steady traffic each new one grew its stack through go-redis, most of the
// check's CPU.
func TestClockReadsShareOneGoroutine(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis: %v", err)
	}
	var mu sync.Mutex
	readers := map[string]int{}
	rdb.AddHook(timeHook{func() {
		buf := make([]byte, 64)
		id, _, _ := strings.Cut(strings.TrimPrefix(string(buf[:runtime.Stack(buf, false)]), "goroutine "), " ")
		mu.Lock()
		readers[id]++
		mu.Unlock()
	}})
	s := New(nil, nil, Options{Queue: "q", Shards: 1, KeyPrefix: "p"})
	c := newClockCheck(s.clock, func(context.Context, int) (string, redis.Cmdable, error) { return "", rdb, nil }, s.lim, s.met)
	c.gap = 0
	defer c.stop() // a second stop, after the one below, does nothing
	read := make(chan struct{}, 1)
	c.wake = func() { read <- struct{}{} }
	for range 20 {
		// Due a second on: no reading confirms it, each asks for one.
		if c.due(0, s.clock.serverNowUs(0)+time.Second.Microseconds(), s.clock.localUs()) {
			t.Fatal("a task due in a second let out")
		}
		select {
		case <-read:
		case <-time.After(5 * time.Second):
			t.Fatal("no reading came")
		}
	}
	c.stop()
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, k := range readers {
		n += k
	}
	if n != 20 || len(readers) != 1 {
		t.Fatalf("%d readings on %d goroutines (%v), want 20 on one", n, len(readers), readers)
	}
}
