package recurring

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// cmdCounter counts the commands a client sends, pipelined ones included,
// by name and first key.
type cmdCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *cmdCounter) add(cmd redis.Cmder) {
	key := ""
	if args := cmd.Args(); len(args) > 1 {
		key = fmt.Sprint(args[1])
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[cmd.Name()+" "+key]++
}

func (c *cmdCounter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *cmdCounter) total(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.n {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

func (*cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add(cmd); return next(ctx, cmd) }
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestRevWatchOneReadForManyQueues: 2,500 queues' revision counters are
// read in 3 MGETs a look, not 2,500 GETs; the first look tells every
// watcher, the next only those whose counter changed.
func TestRevWatchOneReadForManyQueues(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	cc := &cmdCounter{n: map[string]int{}}
	rdb.AddHook(cc)
	w := NewRevWatch(rdb, time.Second, quiet)
	var subs []*revSub
	for q := range 2500 {
		k := shard.Keys{Prefix: prefix, Queue: fmt.Sprint("q", q)}
		if q%2 == 0 {
			rdb.Set(ctx, k.RecurringRev(), q, 0)
		}
		subs = append(subs, w.watch(k.RecurringRev()))
	}
	told := func() []int {
		var out []int
		for n, s := range subs {
			select {
			case <-s.ch:
				out = append(out, n)
			default:
			}
		}
		return out
	}
	w.look(ctx)
	if got := told(); len(got) != 2500 {
		t.Fatalf("the first look told %d of 2500 watchers", len(got))
	}
	if n := cc.total("mget "); n != 3 {
		t.Fatalf("%d MGETs for 2,500 counters, want 3", n)
	}
	w.look(ctx)
	if got := told(); len(got) != 0 {
		t.Fatalf("a look with nothing changed told %v", got)
	}
	rdb.Incr(ctx, shard.Keys{Prefix: prefix, Queue: "q7"}.RecurringRev())    // absent before
	rdb.Incr(ctx, shard.Keys{Prefix: prefix, Queue: "q1234"}.RecurringRev()) // 1234 before
	w.unwatch(subs[2000])
	rdb.Incr(ctx, shard.Keys{Prefix: prefix, Queue: "q2000"}.RecurringRev())
	w.look(ctx)
	if got := told(); fmt.Sprint(got) != "[7 1234]" {
		t.Fatalf("after two counters changed (and an unwatched one) the look told %v, want [7 1234]", got)
	}
	if n := cc.total("get "); n != 0 {
		t.Errorf("%d GETs: the counters are read with MGET only", n)
	}
}

// TestMaterialiserWithRevWatch: a materialiser the RevWatch reads for
// picks up a schedule added while it runs, and reads its counter itself
// only at its start and when told it changed, not every RevPoll (100 ms
// here: polling would read it 15 times or more); a counter of the wrong
// type is reported by its own read.
func TestMaterialiserWithRevWatch(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keys := newKeys(t, rdb, 4)
	cc := &cmdCounter{n: map[string]int{}}
	rdb.AddHook(cc)
	w := NewRevWatch(rdb, 100*time.Millisecond, quiet)
	var logs syncBuffer
	m := New(rdb, Options{Keys: keys, Sweeping: func() bool { return true }, RevWatch: w,
		RevPoll: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Layout: func() shard.Layout { return shard.Layout{Shards: 4} }})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); w.Run(ctx) }()
	go func() { defer wg.Done(); _ = m.Run(ctx) }()
	time.Sleep(time.Second) // about ten looks of the RevWatch
	if _, err := NewStore(rdb, keys).Put(ctx, Def{Queue: "q", Name: "s", Cron: "@daily", Body: "tick"}); err != nil {
		t.Fatal(err)
	}
	i := shard.Index([]byte("tick"), 4)
	deadline := time.Now().Add(5 * time.Second)
	for rdb.ZScore(ctx, keys.Pending(i), "tick").Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the schedule added while the materialiser ran was not materialised within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if n := cc.get("get " + keys.RecurringRev()); n < 1 || n > 4 {
		t.Errorf("the materialiser read its counter %d times; want it read at its start and when told of a change (1 to 4), not every RevPoll of 100 ms", n)
	}
	if n := cc.total("mget "); n < 5 {
		t.Errorf("%d looks of the RevWatch in 1.5 s at 100 ms", n)
	}
	// A counter of the wrong type: the RevWatch reads it as absent (a
	// change, so the materialiser reads it itself and says why it cannot).
	rdb.Del(ctx, keys.RecurringRev())
	rdb.HSet(ctx, keys.RecurringRev(), "f", "v")
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "cannot read the recurring schedules") {
		if time.Now().After(deadline) {
			t.Fatalf("a wrong-type revision counter was not reported within 5 s:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
