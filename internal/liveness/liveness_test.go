package liveness

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// deaths collects the ids handed to OnDead.
type deaths struct {
	mu  sync.Mutex
	ids []string
}

func (d *deaths) add(_ context.Context, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = append(d.ids, id)
}

func (d *deaths) has(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, x := range d.ids {
		if x == id {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, within time.Duration, f func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s", what, within)
		}
	}
}

// fresh returns a client, a key prefix of the test's own (cleaned), and a
// context.
func fresh(t *testing.T) (*redis.Client, string, context.Context, context.CancelFunc) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	ctx, cancel := context.WithCancel(context.Background())
	return rdb, prefix, ctx, cancel
}

// TestDeadOnlyWhenSilentAndDisconnected: a silent instance is declared
// dead (and its claims handed out) only once its connection is gone; one
// that is silent but still subscribed (stopped, cut off) is left alone.
func TestDeadOnlyWhenSilentAndDisconnected(t *testing.T) {
	rdb, prefix, ctx, cancel := fresh(t)
	defer cancel()

	// A stopped instance: a stale record, and its subscription still open.
	stopped := testenv.Redis(t)
	ps := stopped.Subscribe(ctx, Channel(prefix, "stopped#0"))
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// A killed one: a stale record and no connection.
	now, _ := rdb.Time(ctx).Result()
	stale := now.Add(-5 * time.Second).UnixMilli()
	rdb.HSet(ctx, Key(prefix), "stopped#0", stale, "killed#0", stale)

	var d deaths
	l := New(rdb, Options{Prefix: prefix, ID: "watcher", Timeout: 400 * time.Millisecond, OnDead: d.add})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()

	waitFor(t, "the killed instance declared dead", 3*time.Second, func() bool { return d.has("killed#0") })
	if v := rdb.HGet(ctx, Key(prefix), "killed#0").Val(); !strings.HasPrefix(v, "dead ") {
		t.Errorf("killed instance's record %q, want it declared dead", v)
	}
	time.Sleep(time.Second) // several heartbeats of the watcher
	if d.has("stopped#0") {
		t.Fatal("a silent instance still connected was declared dead")
	}
	if ok, fenced := l.Check(l.ID()); !ok || fenced {
		t.Errorf("watcher's own check: ok %v fenced %v, want ok", ok, fenced)
	}
	// Its connection goes (the process died while stopped).
	_ = ps.Close()
	waitFor(t, "the stopped instance declared dead once disconnected", 3*time.Second, func() bool { return d.has("stopped#0") })
	cancel()
	<-done
	if rdb.HExists(context.Background(), Key(prefix), "watcher#0").Val() {
		t.Error("a stopped Liveness left its record")
	}
}

// TestFencedInstanceTakesANewID: an instance declared dead by another
// learns it at its next heartbeat: tasks claimed under its old id are never
// published (fenced), it hands its old id's claims out itself, and goes on
// under a new id.
func TestFencedInstanceTakesANewID(t *testing.T) {
	rdb, prefix, ctx, cancel := fresh(t)
	defer cancel()
	var d deaths
	l := New(rdb, Options{Prefix: prefix, ID: "a", Timeout: 400 * time.Millisecond, OnDead: d.add})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	old := l.ID()
	waitFor(t, "first heartbeat", 2*time.Second, func() bool { ok, _ := l.Check(old); return ok })

	rdb.HSet(ctx, Key(prefix), old, "dead 1") // as another instance's declaration writes it
	waitFor(t, "the fence learnt", 2*time.Second, func() bool { return l.ID() != old })
	if ok, fenced := l.Check(old); ok || !fenced {
		t.Errorf("check of the old id: ok %v fenced %v, want fenced", ok, fenced)
	}
	waitFor(t, "its own old claims handed out", 2*time.Second, func() bool { return d.has(old) })
	waitFor(t, "publishing under the new id", 2*time.Second, func() bool { ok, _ := l.Check(l.ID()); return ok })
	cancel()
	<-done
}

// TestSelfFenceWhenHeartbeatsFail: an instance that cannot heartbeat stops
// publishing within half the timeout, before anyone may declare it dead.
func TestSelfFenceWhenHeartbeatsFail(t *testing.T) {
	rdb, prefix, ctx, cancel := fresh(t)
	defer cancel()
	l := New(rdb, Options{Prefix: prefix, ID: "a", Timeout: 400 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	id := l.ID()
	waitFor(t, "first heartbeat", 2*time.Second, func() bool { ok, _ := l.Check(id); return ok })
	// A wrong-type key makes every heartbeat fail.
	rdb.Del(ctx, Key(prefix))
	rdb.Set(ctx, Key(prefix), "x", 0)
	waitFor(t, "self-fenced", time.Second, func() bool { ok, fenced := l.Check(id); return !ok && !fenced })
	rdb.Del(ctx, Key(prefix))
	waitFor(t, "publishing again", 2*time.Second, func() bool { ok, _ := l.Check(id); return ok })
	cancel()
	<-done
}
