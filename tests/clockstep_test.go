package tests

import (
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestLookaheadRedisClockStepsBack: tasks claimed ahead are held, then the
// Redis server's clock steps back 2 s (an NTP step, or a failover to a
// primary whose clock is behind) before they are due. None may go out
// before its due time by the Redis clock as it reads after the step. (The
// held tasks used to go out by the instance's estimate of the Redis clock,
// refreshed only by claims and sweeps: before their due time.)
func TestLookaheadRedisClockStepsBack(t *testing.T) {
	shift := testenv.NewClockShift(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{Env: shift.Env})
	q := queueSpec{Name: "step", Shards: 4}
	h := newHarnessOn(t, srv.Client(), q)
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	h.lookahead(8*time.Second, 2*time.Second)
	// Default polls: the estimate of the Redis clock is not refreshed
	// every few ms by sweeps.
	delete(h.extra, "DISPATCHER_POLL_INTERVAL")
	delete(h.extra, "DISPATCHER_IDLE_POLL_INTERVAL")
	rec := h.record(q.Name)
	waitStarted(t, h.start())

	from := h.redisNow().Add(3 * time.Second)
	want := scheduleSpread(t, h.producer(q.Name), "s", 200, from, time.Second)
	h.waitHeld(q, want, rec, 3*time.Second)
	// The step comes just before the first task is due (this machine's
	// clock is the Redis server's until then), so that no sweep reads the
	// stepped clock before the held tasks go out.
	time.Sleep(time.Until(from.Add(-20 * time.Millisecond)))
	const back = 2 * time.Second
	stepped := time.Now()
	shift.Set(t, -back)
	h.verify(q.Name, want, 30*time.Second, 0)

	early, worst := 0, time.Duration(0)
	for _, r := range rec.all() {
		if r.at.Before(stepped) {
			t.Errorf("delivery %s before the step, while every task was due later", r.d.MessageId)
			continue
		}
		// This machine's clock is the Redis server's, less the shift.
		redisAt := r.at.Add(-back)
		if by := time.UnixMilli(want[r.d.MessageId]).Sub(redisAt); by > time.Millisecond {
			early++
			worst = max(worst, by)
		}
	}
	t.Logf("%d deliveries after the Redis clock stepped back %s: %d before their due time by it (worst %s)",
		len(rec.all()), back, early, worst)
	if early > 0 {
		t.Errorf("%d tasks received before their due time by the Redis clock (worst by %s)", early, worst)
	}
}
