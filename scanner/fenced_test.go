package scanner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// fencedAtGate is a liveness whose id is declared dead between a claim and
// its publish: the first time the gate asks about the old id, the
// instance has already taken a new one (and handed its old id's claims
// back once, before this claim was answered: no one hands them out).
type fencedAtGate struct {
	mu  sync.Mutex
	cur string
}

func (f *fencedAtGate) ID() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

func (f *fencedAtGate) Check(id string) (ok, fenced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id == "old#0" {
		f.cur = "new#1"
	}
	return id == f.cur, id != f.cur
}

func (f *fencedAtGate) Members(string) []string { return nil }

// TestFencedClaimIsHandedBack: tasks of a claim answered after its
// instance was fenced (and after its one hand-back of the old id) are not
// published under the old id, and must not wait out their lease either:
// they are handed back and claimed again at once.
func TestFencedClaimIsHandedBack(t *testing.T) {
	rdb := testenv.Redis(t)
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	testenv.CleanRedis(t, rdb, k.Prefix)
	conn := testenv.AMQP(t)
	exchange := k.Prefix + ".q"
	got := testenv.Consumer(t, conn, exchange, "q")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := publisher.New(publisher.Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{exchange}, ConfirmTimeout: 5 * time.Second})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()

	prod, err := shard.NewProducer(rdb, k.Prefix, "q", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.Schedule(ctx, []byte("t1"), time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	lv := &fencedAtGate{cur: "old#0"}
	s := New(rdb, pub, Options{Queue: "q", Shards: 1, Exchange: exchange, RoutingKey: "q", KeyPrefix: k.Prefix,
		BatchSize: 10, Pipeline: 2, PollInterval: 50 * time.Millisecond, Lease: 30 * time.Second,
		Lookahead: time.Second, ShutdownTimeout: time.Second, MaxMessageBytes: 1 << 20, MaxAttempts: 5,
		RetryMin: time.Second, RetryMax: time.Minute, Liveness: lv})
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(ctx) }()

	select {
	case d := <-got:
		if string(d.Body) != "t1" {
			t.Fatalf("delivered %q, want t1", d.Body)
		}
	case <-time.After(10 * time.Second):
		// The lease is 30 s: within 10 s only a hand-back brings it.
		t.Fatalf("a task claimed under a fenced id was left to its lease: in flight %v",
			rdb.ZRangeWithScores(ctx, k.Inflight(0), 0, -1).Val())
	}
}
