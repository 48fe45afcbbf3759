package tests

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// End-to-end tests of DISPATCHER_LOOKAHEAD: a claim takes the tasks due
// within the look-ahead into the in-flight set, the instance holds them and
// publishes each at its due time by the Redis clock, never before; on
// SIGTERM it hands them back at once (lease 0), on SIGKILL their lease
// (LEASE + LOOKAHEAD) brings them back.
//
// The tests use a large look-ahead so that the time a task is held is long
// enough to act inside it on a loaded machine. A shard is claimed a
// quarter of the look-ahead before its earliest task is due, so an 8s
// look-ahead holds the first task of a shard for about 2s.
//
// "Never early" is checked on the Redis clock: every message carries
// x-due-ms and, with DISPATCHER_STAMP_PUBLISHED, x-published-us (when its
// publish began, µs on the Redis clock); x-published-us < x-due-ms*1000
// is an early publish. The consumer's receipt time (this machine's clock,
// which is also the Redis server's) is checked too.

// lookahead sets the look-ahead and lease of h's instances, short polls,
// and the publish stamp.
func (h *harness) lookahead(ahead, lease time.Duration) {
	h.extra["DISPATCHER_LOOKAHEAD"] = ahead.String()
	h.extra["DISPATCHER_LEASE"] = lease.String()
	// Long enough that a confirm is not given up on (a retry would be a
	// duplicate) on a busy machine, and shorter than the lease.
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = (lease * 3 / 4).String()
	h.extra["DISPATCHER_POLL_INTERVAL"] = "20ms"
	h.extra["DISPATCHER_IDLE_POLL_INTERVAL"] = "100ms"
	h.extra["DISPATCHER_STAMP_PUBLISHED"] = "true"
}

// waitStarted waits until p has logged that it is dispatching.
func waitStarted(t *testing.T, p *proc) {
	t.Helper()
	eventually(t, 15*time.Second, "the dispatcher to start", func() bool {
		return strings.Contains(p.out.String(), "msg=dispatching")
	})
}

// laState is a queue's pending count and in-flight set at one instant of
// the Redis clock (read in one MULTI).
type laState struct {
	nowUs    int64              // Redis TIME
	pending  int64              // tasks in the pending shards
	inflight map[string]float64 // in-flight entry -> score (lease deadline ms, 0: handed back)
	shardOf  map[string]int     // in-flight entry -> shard
	claims   []string           // per shard, its :claim record: the last claims' "<instance>/<token> <deadline>" pairs, newest last
}

// pendingIDs returns the message_id of every pending task of q (member
// and score, as a claim would make it).
func (h *harness) pendingIDs(q queueSpec) []string {
	ctx := context.Background()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	var ids []string
	for i := 0; i < q.Shards; i++ {
		for _, z := range h.rdb.ZRangeWithScores(ctx, k.Pending(i), 0, -1).Val() {
			ids = append(ids, shard.MessageID([]byte(z.Member.(string)), int64(z.Score)))
		}
	}
	return ids
}

func (h *harness) laState(q queueSpec) laState {
	h.t.Helper()
	ctx := context.Background()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	var tm *redis.TimeCmd
	var pend []*redis.IntCmd
	var fl []*redis.ZSliceCmd
	var cl []*redis.StringCmd
	_, err := h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		for i := 0; i < q.Shards; i++ {
			pend = append(pend, p.ZCard(ctx, k.Pending(i)))
			fl = append(fl, p.ZRangeWithScores(ctx, k.Inflight(i), 0, -1))
			cl = append(cl, p.Get(ctx, k.LastClaim(i)))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		h.t.Fatalf("read queue state: %v", err)
	}
	s := laState{nowUs: tm.Val().UnixMicro(), inflight: map[string]float64{}, shardOf: map[string]int{}}
	for i := 0; i < q.Shards; i++ {
		s.pending += pend[i].Val()
		for _, z := range fl[i].Val() {
			s.inflight[z.Member.(string)] = z.Score
			s.shardOf[z.Member.(string)] = i
		}
		s.claims = append(s.claims, cl[i].Val())
	}
	return s
}

// redisNow is the Redis server's clock.
func (h *harness) redisNow() time.Time {
	h.t.Helper()
	tm, err := h.rdb.Time(context.Background()).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return tm
}

// entryID is the message_id of an in-flight entry "<due_ms>:<member>".
func entryID(t testing.TB, entry string) (string, int64) {
	t.Helper()
	due, member, ok := strings.Cut(entry, ":")
	ms, err := strconv.ParseInt(due, 10, 64)
	if !ok || err != nil {
		t.Fatalf("bad in-flight entry %q", entry)
	}
	return shard.MessageID([]byte(member), ms), ms
}

// waitHeld waits until every one of want's tasks left the pending shards
// and is in flight, and fails the test if that happened only once the
// earliest of them was due: the claim ahead of the due time is the
// feature under test. It also fails if anything was delivered meanwhile.
func (h *harness) waitHeld(q queueSpec, want map[string]int64, rec *recorder, timeout time.Duration) laState {
	h.t.Helper()
	t := h.t
	first := int64(1<<63 - 1)
	for _, due := range want {
		first = min(first, due)
	}
	var s laState
	eventually(t, timeout, "every task in flight", func() bool {
		s = h.laState(q)
		return s.pending == 0 && len(s.inflight) == len(want)
	})
	for e := range s.inflight {
		if id, _ := entryID(t, e); want[id] == 0 {
			t.Fatalf("in flight: %q, not a scheduled task", e)
		}
	}
	if s.nowUs >= first*1000 {
		t.Fatalf("the tasks were in flight only %.1f ms after the earliest was due: not claimed ahead",
			float64(s.nowUs-first*1000)/1000)
	}
	if n := len(rec.all()); n > 0 {
		t.Fatalf("%d deliveries before the earliest task was due (held tasks must wait for their due time)", n)
	}
	t.Logf("all %d tasks in flight (held) %.0f ms before the earliest is due", len(want), float64(first*1000-s.nowUs)/1000)
	return s
}

// holders are the pids of the instances whose claims hold s's entries,
// read from the shards' last claims: each entry must carry the deadline of
// its shard's last claim (one claim per shard took them).
func holders(t *testing.T, s laState) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	for pid := range heldBy(t, s) {
		out[pid] = true
	}
	return out
}

// heldBy is holders with the entries each pid holds.
func heldBy(t *testing.T, s laState) map[int][]string {
	t.Helper()
	out := map[int][]string{}
	for e, score := range s.inflight {
		i := s.shardOf[e]
		f := strings.Fields(s.claims[i])
		var token, deadline string
		if len(f) >= 2 {
			token, deadline = f[len(f)-2], f[len(f)-1]
		}
		if deadline == "" || deadline != strconv.FormatInt(int64(score), 10) {
			t.Fatalf("shard %d: entry %q has lease %.0f, the shard's last claim is %q (its :claim record %q): more than one claim took the tasks",
				i, e, score, token+" "+deadline, s.claims[i])
		}
		inst, _, _ := strings.Cut(token, "/") // host:pid:random
		parts := strings.Split(inst, ":")
		if len(parts) < 3 {
			t.Fatalf("claim token %q names no pid", token)
		}
		pid, err := strconv.Atoi(parts[len(parts)-2])
		if err != nil {
			t.Fatalf("claim token %q names no pid", token)
		}
		out[pid] = append(out[pid], e)
	}
	return out
}

func headerInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int:
		return int64(n), true
	}
	return 0, false
}

// checkStamps fails the test for every delivery published or received
// before its due time: x-published-us (Redis clock) must not be before
// x-due-ms*1000, x-due-ms must be the scheduled due time, and the receipt
// (this machine's clock, 1 ms of slack for its truncation to ms) must not
// be before it either. It returns how many deliveries were published
// before notAfterUs (Redis clock, µs).
func checkStamps(t *testing.T, rs []received, want map[string]int64, notAfterUs int64) (before int) {
	t.Helper()
	early := 0
	worst := int64(-1 << 63)
	for _, r := range rs {
		id := r.d.MessageId
		due, ok := headerInt(r.d.Headers["x-due-ms"])
		pub, okP := headerInt(r.d.Headers["x-published-us"])
		switch {
		case want[id] == 0:
			t.Errorf("delivery %s was not scheduled", id)
			continue
		case !ok || !okP:
			t.Errorf("delivery %s without x-due-ms or x-published-us: %v", id, r.d.Headers)
			continue
		case due != want[id]:
			t.Errorf("delivery %s: x-due-ms %d, scheduled %d", id, due, want[id])
		}
		isEarly := false
		if pub < due*1000 {
			isEarly = true
			t.Errorf("delivery %s published %d µs before its due time (x-published-us %d, x-due-ms %d)", id, due*1000-pub, pub, due)
		}
		if r.at.UnixMicro() < due*1000-1000 {
			isEarly = true
			t.Errorf("delivery %s received %d µs before its due time", id, due*1000-r.at.UnixMicro())
		}
		if isEarly {
			early++
		}
		worst = max(worst, pub-due*1000)
		if pub < notAfterUs {
			before++
		}
	}
	t.Logf("%d deliveries, %d early; publish minus due time, latest: %.1f ms (Redis clock)", len(rs), early, float64(worst)/1000)
	return before
}

// emptyAtEnd waits until nothing of q is left in Redis.
func (h *harness) emptyAtEnd(q queueSpec) {
	h.t.Helper()
	eventually(h.t, 10*time.Second, "nothing left pending, in flight or dead", func() bool {
		p, f, d := h.leftovers(q)
		return p+f+d == 0
	})
}

// TestLookaheadHeldThenOnTime: tasks scheduled 3 to 4 s ahead are claimed
// ahead of their due time (they leave the pending shards for the in-flight
// set while none is due yet), nothing arrives before it is due, and every
// task arrives exactly once, none published early.
func TestLookaheadHeldThenOnTime(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "held", Shards: 4})
	h.lookahead(8*time.Second, 2*time.Second)
	rec := h.record("held")
	waitStarted(t, h.start())

	from := h.redisNow().Add(3 * time.Second)
	want := scheduleSpread(t, h.producer("held"), "h", 200, from, time.Second)
	verifyWhile(h, "held", want, 20*time.Second, 0, func() {
		h.waitHeld(h.queues[0], want, rec, 3*time.Second)
	})
	checkStamps(t, rec.all(), want, 0)
	h.emptyAtEnd(h.queues[0])
}

// TestLookaheadSIGTERMHandsBack: one instance holds the tasks and gets
// SIGTERM: it exits 0 having put every held task back into pending with
// its due time (not left to its lease, and cancellable again), nothing in
// flight; a second instance started then claims them ahead in turn and
// publishes each at its due time: all arrive exactly once (the stopped one
// published nothing), none early.
func TestLookaheadSIGTERMHandsBack(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "term", Shards: 4})
	h.lookahead(8*time.Second, 2*time.Second)
	rec := h.record("term")
	a := h.start()
	waitStarted(t, a)

	from := h.redisNow().Add(4 * time.Second)
	want := scheduleSpread(t, h.producer("term"), "t", 100, from, 500*time.Millisecond)
	first := from.UnixMilli()
	verifyWhile(h, "term", want, 20*time.Second, 0, func() {
		held := h.waitHeld(h.queues[0], want, rec, 4*time.Second)
		if hs := holders(t, held); len(hs) != 1 || !hs[a.cmd.Process.Pid] {
			t.Fatalf("holders %v, want only the one instance %d", hs, a.cmd.Process.Pid)
		}
		signalledUs := h.redisNow().UnixMicro()
		if signalledUs >= first*1000 {
			t.Fatalf("the earliest task was due before the SIGTERM: the signal missed the holding window")
		}
		a.signal(syscall.SIGTERM)
		if code := a.exitCode(15 * time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM", code)
		}
		s := h.laState(h.queues[0])
		t.Logf("exited %.0f ms after the SIGTERM, %.0f ms before the earliest due time: %d pending, %d in flight, %d delivered",
			float64(s.nowUs-signalledUs)/1000, float64(first*1000-s.nowUs)/1000, s.pending, len(s.inflight), len(rec.all()))
		if s.pending != int64(len(want)) || len(s.inflight) != 0 {
			t.Fatalf("after a clean stop while holding: %d pending, %d in flight; want %d, 0", s.pending, len(s.inflight), len(want))
		}
		for _, id := range h.pendingIDs(h.queues[0]) {
			if _, ok := want[id]; !ok {
				t.Fatalf("%s back in pending is not a scheduling of the test's (a wrong score?)", id)
			}
		}
		b := h.start()
		// The new instance claims them ahead in turn and holds them until
		// they are due.
		eventually(t, 10*time.Second, "the second instance to claim the tasks", func() bool {
			s = h.laState(h.queues[0])
			return s.pending == 0
		})
		if len(s.inflight) > 0 {
			if hs := holders(t, s); !hs[b.cmd.Process.Pid] {
				t.Errorf("tasks claimed by %v, not by the second instance %d", hs, b.cmd.Process.Pid)
			}
		}
		t.Logf("second instance claimed them %.0f ms before the earliest due time (negative: after)",
			float64(first*1000-s.nowUs)/1000)
	})
	checkStamps(t, rec.all(), want, 0)
	if !strings.Contains(a.out.String(), "msg=stopped") {
		t.Errorf("the stopped instance did not log that it stopped")
	}
	h.emptyAtEnd(h.queues[0])
}

// TestLookaheadSIGTERMOtherInstanceTakesOver: two instances run and hold
// the tasks (each claims ahead from its own share of the shards); one of
// them gets SIGTERM while it holds them. Every entry it held leaves its
// claim's lease deadline long before that deadline (it was handed back and
// claimed by the other instance, not left to the lease), the other
// instance's entries stay as they were, and every task is delivered
// exactly once, none early.
func TestLookaheadSIGTERMOtherInstanceTakesOver(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "over", Shards: 4})
	h.lookahead(8*time.Second, 2*time.Second)
	rec := h.record("over")
	procs := []*proc{h.start(), h.start()}
	for _, p := range procs {
		waitStarted(t, p)
	}

	from := h.redisNow().Add(4 * time.Second)
	want := scheduleSpread(t, h.producer("over"), "o", 100, from, 500*time.Millisecond)
	first := from.UnixMilli()
	verifyWhile(h, "over", want, 20*time.Second, 0, func() {
		held := h.waitHeld(h.queues[0], want, rec, 4*time.Second)
		byPid := heldBy(t, held)
		var stopped []*proc
		for _, p := range procs {
			if len(byPid[p.cmd.Process.Pid]) > 0 {
				stopped = append(stopped, p)
			}
		}
		if len(stopped) == 0 || len(byPid) > len(procs) {
			t.Fatalf("held by %d pids: want one or both of the two instances", len(byPid))
		}
		// Stop the instance holding the most; the other keeps what it holds.
		if len(stopped) == 2 && len(byPid[stopped[1].cmd.Process.Pid]) > len(byPid[stopped[0].cmd.Process.Pid]) {
			stopped[0], stopped[1] = stopped[1], stopped[0]
		}
		mine := map[string]bool{}
		for _, e := range byPid[stopped[0].cmd.Process.Pid] {
			mine[e] = true
		}
		t.Logf("the stopped instance holds %d of %d tasks", len(mine), len(held.inflight))
		signalledUs := h.redisNow().UnixMicro()
		stopped[0].signal(syscall.SIGTERM)
		// Handed back: every entry's score leaves its lease deadline
		// (0, or the other instance's new claim) well before it.
		var s laState
		// A stop puts held tasks back into pending, from where the other
		// instance claims them again: wait for that (reading in between
		// could find them pending, none in flight).
		eventually(t, 10*time.Second, "every held task handed back and claimed again", func() bool {
			s = h.laState(h.queues[0])
			for e, old := range held.inflight {
				if !mine[e] {
					continue
				}
				if score, ok := s.inflight[e]; !ok || score == old {
					return len(rec.all()) > 0 // some went out: stop waiting, the checks below say what happened
				}
			}
			return true
		})
		lease := int64(1<<63 - 1)
		for e, score := range held.inflight {
			if mine[e] {
				lease = min(lease, int64(score))
			} else if s.nowUs < first*1000 && s.inflight[e] != score {
				t.Errorf("%q, held by the instance still running, changed from %.0f to %.0f before any task was due", e, score, s.inflight[e])
			}
		}
		t.Logf("every held task handed back %.0f ms after the SIGTERM, %.0f ms before the earliest due time, %.0f ms before its lease ran out; %d still in flight, %d delivered",
			float64(s.nowUs-signalledUs)/1000, float64(first*1000-s.nowUs)/1000, float64(lease*1000-s.nowUs)/1000,
			len(s.inflight), len(rec.all()))
		if s.nowUs >= lease*1000 {
			t.Errorf("the held tasks changed hands only once their lease ran out: not handed back on SIGTERM")
		}
		if s.nowUs < first*1000 && len(s.inflight) != len(want) {
			t.Errorf("%d of %d held tasks left the in-flight set before any was due", len(want)-len(s.inflight), len(want))
		}
		if code := stopped[0].exitCode(15 * time.Second); code != 0 {
			t.Errorf("exit code %d after SIGTERM", code)
		}
	})
	checkStamps(t, rec.all(), want, 0)
	h.emptyAtEnd(h.queues[0])
}

// TestLookaheadSIGKILLLeaseBringsBack: with liveness off, the instance
// holding the tasks is killed (SIGKILL) before any is due; the tasks stay in flight under the
// claim's lease (LEASE + LOOKAHEAD), and once it ran out another instance
// delivers every one of them, none published before the lease ran out,
// none early. The killed instance published nothing (it died before any
// task was due), so no duplicate is allowed; any delivery published before
// the kill is counted as one.
func TestLookaheadSIGKILLLeaseBringsBack(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "kill", Shards: 4})
	h.lookahead(8*time.Second, 2*time.Second)
	// The lease path: with liveness on, the next instance would find the
	// killed one dead and hand its claims out at once (recovery_test.go).
	h.extra["DISPATCHER_LIVENESS_TIMEOUT"] = "0"
	rec := h.record("kill")
	a := h.start()
	waitStarted(t, a)

	from := h.redisNow().Add(3 * time.Second)
	want := scheduleSpread(t, h.producer("kill"), "k", 100, from, 500*time.Millisecond)
	first := from.UnixMilli()
	var held laState
	var killedUs int64
	verifyWhile(h, "kill", want, 25*time.Second, 0, func() {
		held = h.waitHeld(h.queues[0], want, rec, 3*time.Second)
		if hs := holders(t, held); len(hs) != 1 || !hs[a.cmd.Process.Pid] {
			t.Fatalf("holders %v, want only the one instance %d", hs, a.cmd.Process.Pid)
		}
		a.signal(syscall.SIGKILL)
		a.wait(10 * time.Second)
		killedUs = h.redisNow().UnixMicro()
		if killedUs >= first*1000 {
			t.Fatalf("killed only after the earliest task was due: the kill missed the holding window")
		}
		s := h.laState(h.queues[0])
		for e, score := range held.inflight {
			if s.inflight[e] != score {
				t.Errorf("entry %q: lease %.0f after the kill, %.0f before", e, s.inflight[e], score)
			}
		}
		t.Logf("killed %.0f ms before the earliest due time; %d in flight under their lease", float64(first*1000-killedUs)/1000, len(s.inflight))
		h.start() // takes them over when the lease runs out
	})
	dups := checkStamps(t, rec.all(), want, killedUs)
	if dups > 0 {
		t.Errorf("%d deliveries published before the kill, by the killed instance", dups)
	}
	// Nothing goes out before the killed instance's lease ran out.
	leases := map[string]int64{}
	for e, score := range held.inflight {
		id, _ := entryID(t, e)
		leases[id] = int64(score)
	}
	var soonest int64 = 1<<63 - 1
	for _, r := range rec.all() {
		pub, _ := headerInt(r.d.Headers["x-published-us"])
		lease := leases[r.d.MessageId]
		if pub < lease*1000 {
			t.Errorf("delivery %s published %d µs before the killed instance's lease ran out", r.d.MessageId, lease*1000-pub)
		}
		soonest = min(soonest, pub-lease*1000)
	}
	t.Logf("first publish %.1f ms after the lease ran out", float64(soonest)/1000)
	h.emptyAtEnd(h.queues[0])
}

// TestLookaheadCancelInsideAndOutside documents the one semantic change
// of the look-ahead for producers: a task can be cancelled (ZREM from its
// pending shard) only until it is claimed, i.e. until it is within the
// look-ahead of its due time. One shard, two tasks: "inside" due in 2.5 s,
// "outside" due in 6.5 s, look-ahead 3 s. Once "inside" is claimed (in
// flight, held), ZREM of it returns 0 and it is delivered at its due time;
// "outside" is still pending, ZREM returns 1, and it is never delivered.
func TestLookaheadCancelInsideAndOutside(t *testing.T) {
	const ahead = 3 * time.Second
	q := queueSpec{Name: "cancel", Shards: 1}
	h := newHarness(t, q)
	h.lookahead(ahead, 2*time.Second)
	rec := h.record("cancel")
	waitStarted(t, h.start())
	ctx := context.Background()
	p := h.producer("cancel")
	p.SetWakeWithin(0) // found by the sweeps alone

	now := h.redisNow()
	inside, outside := []byte("inside"), []byte("outside")
	insideDue, outsideDue := now.Add(2500*time.Millisecond), now.Add(6500*time.Millisecond)
	want := scheduleAt(t, p, insideDue, inside)
	scheduleAt(t, p, outsideDue, outside)
	key := p.Keys().Shard(inside, q.Shards)

	o := verifyWhile(h, "cancel", want, 15*time.Second, 0, func() {
		var s laState
		eventually(t, 5*time.Second, `"inside" in flight`, func() bool {
			s = h.laState(q)
			return len(s.inflight) > 0
		})
		insideEntry := fmt.Sprintf("%d:inside", insideDue.UnixMilli())
		if _, ok := s.inflight[insideEntry]; !ok || len(s.inflight) != 1 || s.pending != 1 {
			t.Fatalf("in flight %v, %d pending: want only %q in flight and \"outside\" pending", s.inflight, s.pending, insideEntry)
		}
		if s.nowUs >= insideDue.UnixMicro() {
			t.Fatalf(`"inside" claimed only once due: not claimed ahead`)
		}
		// Inside the window: claimed, no longer pending; ZREM finds nothing.
		n, err := h.rdb.ZRem(ctx, key, inside).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf(`ZREM of "inside" (claimed, held) returned %d, want 0`, n)
		}
		// Outside the window: still pending, ZREM removes it.
		at := h.redisNow()
		n, err = h.rdb.ZRem(ctx, key, outside).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !at.Add(ahead).Before(outsideDue) {
			t.Fatalf(`"outside" cancelled only %s before due, within the look-ahead: the test proved nothing`, outsideDue.Sub(at))
		}
		if n != 1 {
			t.Errorf(`ZREM of "outside" (%s before due, look-ahead %s) returned %d, want 1`, outsideDue.Sub(at).Round(time.Millisecond), ahead, n)
		}
		t.Logf(`"inside" held %.0f ms before due: ZREM 0; "outside" %s before due: ZREM %d`,
			float64(insideDue.UnixMicro()-s.nowUs)/1000, outsideDue.Sub(at).Round(time.Millisecond), n)
	})
	// "outside" would have been claimed 3 s before its due time and
	// delivered at it: wait past that.
	time.Sleep(time.Until(outsideDue.Add(time.Second)))
	rs := rec.all()
	checkStamps(t, rs, want, 0)
	for _, r := range rs {
		if string(r.d.Body) == "outside" {
			t.Errorf(`the cancelled task "outside" was delivered (%s)`, r.d.MessageId)
		}
	}
	if o.Delivered != 1 || len(rs) != 1 {
		t.Errorf(`%d deliveries, want only "inside" once`, len(rs))
	}
	h.emptyAtEnd(q)
}
