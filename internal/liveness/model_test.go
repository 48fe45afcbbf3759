package liveness

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// blocker is a go-redis hook that holds (stop) or fails (cut) an
// instance's commands, as a SIGSTOP or a cut-off network would, while its
// subscription's connection stays open. It keeps the spans in which it
// did either: an instance cannot judge others then.
type blocker struct {
	stopped, cut atomic.Bool

	mu     sync.Mutex
	since  [2]time.Time // when the stop (0) and the cut (1) now on began
	faults []span       // the ones over
}

// span is a time from one instant to another.
type span struct{ from, to time.Time }

const (
	stop = 0
	cut  = 1
)

// set turns a stop or a cut on or off.
func (b *blocker) set(kind int, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	flag := &b.stopped
	if kind == cut {
		flag = &b.cut
	}
	if flag.Load() == on {
		return
	}
	flag.Store(on)
	now := time.Now()
	if on {
		b.since[kind] = now
		return
	}
	b.faults = append(b.faults, span{b.since[kind], now})
	b.since[kind] = time.Time{}
}

// clear reports whether no stop or cut was on at any time in w.
func (b *blocker) clear(w span) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, at := range b.since {
		if !at.IsZero() && at.Before(w.to) {
			return false
		}
	}
	for _, f := range b.faults {
		if f.from.Before(w.to) && f.to.After(w.from) {
			return false
		}
	}
	return true
}

func (b *blocker) DialHook(next redis.DialHook) redis.DialHook { return next }

func (b *blocker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for b.stopped.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if b.cut.Load() {
			cmd.SetErr(errors.New("cut off"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (b *blocker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// modelInstance is one simulated instance.
type modelInstance struct {
	name   string
	rdb    *redis.Client
	hook   *blocker
	lost   atomic.Bool // its subscription is gone (set before, cleared well after)
	l      *Liveness
	cancel context.CancelFunc
	done   chan struct{}
	dead   bool // crashed: its connections closed, never stopped cleanly
	// started, diedAt: when it started and crashed (zero if it did not).
	started, diedAt time.Time
}

// judgeFrom is the first instant from t on at which one of all but the
// crashed instance could declare it dead: that one has run, neither
// stopped nor cut off, for the span w up to it (its heartbeats went
// through for the timeout, so others are judgeable; see judgeable), and
// goes on so for act more (its next heartbeat and one round of judging).
// The protocol promises a declaration soon after such an instant, not
// while every other instance is faulted or new.
func judgeFrom(all []*modelInstance, crashed *modelInstance, t time.Time, w, act time.Duration) (time.Time, bool) {
	at := []time.Time{t}
	for _, in := range all {
		at = append(at, in.started.Add(w))
		in.hook.mu.Lock()
		for _, f := range in.hook.faults {
			at = append(at, f.to.Add(w))
		}
		in.hook.mu.Unlock()
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	for _, c := range at {
		if c.Before(t) {
			continue
		}
		for _, in := range all {
			if in == crashed || in.started.After(c.Add(-w)) || !in.diedAt.IsZero() && in.diedAt.Before(c.Add(act)) {
				continue
			}
			if in.hook.clear(span{c.Add(-w), c.Add(act)}) {
				return c, true
			}
		}
	}
	return time.Time{}, false
}

// subscribedBefore reports whether in, under liveness id, has had its
// subscription confirmed by Redis since before t and not lost since: then a
// judge's count of its subscribers, read at most half a timeout before the
// declaration (t leaves a second more for a slow goroutine), found it.
// The test's flags alone cannot say so: a subscription opened again while
// the instance is cut off is not opened (go-redis's connection handshake
// goes through the hook that cuts it) until go-redis retries it after the
// cut, and a fenced instance may be cut off right as it subscribes under
// its new id.
func subscribedBefore(in *modelInstance, id string, t time.Time) bool {
	in.l.mu.Lock()
	defer in.l.mu.Unlock()
	return in.l.id == id && !in.l.subAt.IsZero() && in.l.subAt.Before(t)
}

// TestModelLiveness runs instances that crash, stop (still connected),
// get cut off from Redis and lose their subscription, at random, and
// checks the protocol's promises at every declaration of death:
//   - the instance declared dead no longer publishes under that id: its
//     own Check says not ok at that moment (it fenced itself first);
//   - an instance that is stopped or cut off but still subscribed is never
//     declared dead (subscribed: the test did not drop its subscription,
//     and Redis confirmed it to the instance, which has seen no error on it
//     since);
//   - a crashed instance is declared dead within a few heartbeats of the
//     first instant its record is a timeout old and another instance has
//     run unfaulted long enough to judge it (not while every other one is
//     stopped, cut off or new).
func TestModelLiveness(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	url := testenv.RedisURL(t)
	admin := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, admin, prefix)
	const timeout = 400 * time.Millisecond

	var mu sync.Mutex
	byName := map[string]*modelInstance{} // by ID's name: its ids are name#epoch
	crashedAt := map[string]time.Time{}
	declaredAt := map[string]time.Time{}
	var violations []string
	onDead := func(_ context.Context, id string) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := declaredAt[id]; ok {
			return // the declarer's call came first: the checks are its
		}
		declaredAt[id] = time.Now()
		name, _, _ := strings.Cut(id, "#")
		in := byName[name]
		if in == nil || in.dead {
			return
		}
		if ok, _ := in.l.Check(id); ok {
			violations = append(violations, fmt.Sprintf("%s declared dead while it could still publish under that id", id))
		}
		if !in.lost.Load() && subscribedBefore(in, id, time.Now().Add(-timeout/2-time.Second)) {
			// Only an instance whose subscription went may be declared dead.
			violations = append(violations, fmt.Sprintf("%s declared dead while subscribed (stopped %v, cut %v)", id, in.hook.stopped.Load(), in.hook.cut.Load()))
		}
	}
	n := 0
	var all []*modelInstance // every instance started, under mu
	start := func() *modelInstance {
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		in := &modelInstance{name: fmt.Sprintf("m%d", n), hook: &blocker{}, done: make(chan struct{})}
		n++
		opt.Dialer = (&net.Dialer{}).DialContext
		in.rdb = redis.NewClient(opt)
		in.rdb.AddHook(in.hook)
		in.l = New(in.rdb, Options{Prefix: prefix, ID: in.name, Timeout: timeout, OnDead: onDead, Queues: []string{"q"}})
		in.started = time.Now()
		mu.Lock()
		byName[in.name] = in
		all = append(all, in)
		mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		in.cancel = cancel
		go func() { defer close(in.done); _ = in.l.Run(ctx) }()
		return in
	}
	live := []*modelInstance{start(), start(), start()}
	var pending sync.WaitGroup // the timed ends of stops and cuts
	later := func(d time.Duration, f func()) {
		pending.Add(1)
		time.AfterFunc(d, func() { defer pending.Done(); f() })
	}
	end := time.Now().Add(8 * time.Second)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(100+rng.Intn(300)) * time.Millisecond)
		k := rng.Intn(len(live))
		in := live[k]
		switch rng.Intn(4) {
		case 0: // crash: connections closed, no clean stop
			in.l.mu.Lock()
			recorded := !in.l.okSent.IsZero() // its current id has a record
			in.l.mu.Unlock()
			mu.Lock()
			in.dead = true
			in.diedAt = time.Now()
			if recorded {
				crashedAt[in.l.ID()] = time.Now()
			}
			mu.Unlock()
			in.hook.set(cut, true) // its last writes fail, as in a crash
			in.lost.Store(true)
			in.l.mu.Lock()
			ps := in.l.ps
			in.l.mu.Unlock()
			if ps != nil {
				_ = ps.Close()
			}
			_ = in.rdb.Close()
			in.cancel()
			live[k] = start()
		case 1: // stopped, still connected
			in.hook.set(stop, true)
			d := time.Duration(rng.Intn(int(3 * timeout)))
			later(d, func() { in.hook.set(stop, false) })
		case 2: // cut off, still subscribed
			in.hook.set(cut, true)
			d := time.Duration(rng.Intn(int(3 * timeout)))
			later(d, func() { in.hook.set(cut, false) })
		case 3: // cut off and its subscription lost: may be declared dead, must fence
			if in.lost.Load() {
				continue
			}
			in.lost.Store(true)
			in.hook.set(cut, true)
			in.l.mu.Lock()
			ps, id := in.l.ps, in.l.id
			in.l.mu.Unlock()
			if ps != nil {
				_ = ps.Close()
			}
			d := time.Duration(rng.Intn(int(3 * timeout)))
			later(d, func() {
				in.hook.set(cut, false)
				// go-redis would reconnect a subscription it lost; here the
				// instance subscribes again unless the fence gave it a new
				// id (and subscription) meanwhile.
				time.Sleep(timeout / 2)
				mu.Lock()
				crashed := in.dead
				mu.Unlock()
				if !crashed && in.l.ID() == id {
					in.l.subscribe(context.Background())
				}
				time.Sleep(timeout)
				in.lost.Store(false)
			})
		}
	}
	pending.Wait()
	time.Sleep(timeout + time.Second)
	// Every instance is subscribed again once the faults are over: the
	// check above counts an instance as subscribed only once Redis
	// confirmed it, so a subscription that never comes back would
	// otherwise go unseen.
	for _, in := range live {
		in.l.mu.Lock()
		sub, id := !in.l.subAt.IsZero(), in.l.id
		in.l.mu.Unlock()
		if !sub {
			t.Errorf("%s not subscribed %s after the last fault ended", id, timeout+time.Second)
		}
	}
	for _, in := range live {
		in.hook.set(stop, false)
		in.hook.set(cut, false)
		in.cancel()
		<-in.done
		_ = in.rdb.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	var worst, worstJudged time.Duration // the latest declarations, for the log
	for id, at := range crashedAt {
		d, ok := declaredAt[id]
		if !ok {
			t.Errorf("crashed %s never declared dead", id)
			continue
		}
		// A judge's heartbeats go through for the timeout (a quarter of it
		// apart) before it judges: the window it must have run unfaulted;
		// then its next heartbeat and a round of judging (calls of half
		// the timeout) within a timeout.
		from, ok := judgeFrom(all, byName[strings.Split(id, "#")[0]], at.Add(timeout), timeout+timeout/2, timeout)
		worst = max(worst, d.Sub(at))
		switch {
		case !ok:
			t.Errorf("crashed %s: no other instance ran unfaulted %s before and %s after an instant after it, yet the faults end well before the test does", id, timeout+timeout/2, timeout)
			continue
		case d.Sub(from) > time.Second:
			t.Errorf("crashed %s declared dead %s after the crash, %s after another instance could (%s unfaulted)", id, d.Sub(at), d.Sub(from), timeout+timeout/2)
		}
		worstJudged = max(worstJudged, d.Sub(from))
	}
	t.Logf("%d instances, %d crashes, %d declarations; the latest %s after its crash, %s after another instance could", n, len(crashedAt), len(declaredAt), worst, worstJudged)
}
