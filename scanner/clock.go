package scanner

import (
	"sync"
	"sync/atomic"
	"time"
)

// Due times are the Redis server's, and on a cluster each primary has a
// clock of its own: the estimate of how far each is from the local clock
// is read by the loop, the publishes and the holder alike (hence the
// atomics), so it stands apart from all of them.

// serverClock estimates the Redis server clock of each shard's primary.
type serverClock struct {
	// now is the local clock (Options.Now). Its readings are taken as µs
	// since epoch by their monotonic part (local), so that a step of the
	// wall clock (NTP, a VM resumed) moves no held task's publish time:
	// only the server's clock decides what is due.
	now   func() time.Time
	epoch time.Time

	// Redis server clock minus local clock, µs: per shard, since on a
	// cluster shards live on primaries with clocks of their own; offset is
	// the last one seen on any shard, for shards not seen yet.
	offset  atomic.Int64
	offsets []atomic.Int64
	clocked []atomic.Bool
	// The round trip each shard's offset was measured over, and when:
	// under mu (observe runs on the loop's goroutine and on clockCheck's).
	mu  sync.Mutex
	rtt []time.Duration
	at  []time.Time
	// The offset less half the round trip of the sample it came from,
	// µs: the server clock is surely at least the local clock plus this.
	// One atomic with the offset's own sample, so that no reader pairs
	// one sample's offset with another's round trip.
	sure  atomic.Int64
	sures []atomic.Int64
}

// local is a local clock reading in µs, counted from epoch by the
// monotonic clock when the readings carry one (time.Now's do).
func (c *serverClock) local(t time.Time) int64 {
	return c.epoch.UnixMicro() + t.Sub(c.epoch).Microseconds()
}

// localUs is the local clock now, µs (see local).
func (c *serverClock) localUs() int64 { return c.local(c.now()) }

func newServerClock(shards int, now func() time.Time) *serverClock {
	return &serverClock{now: now, epoch: now(), offsets: make([]atomic.Int64, shards), clocked: make([]atomic.Bool, shards),
		rtt: make([]time.Duration, shards), at: make([]time.Time, shards), sures: make([]atomic.Int64, shards)}
}

// serverNow estimates the clock of the Redis primary of shard i, in ms.
func (c *serverClock) serverNow(i int) int64 { return c.serverNowUs(i) / 1000 }

// serverNowUs is serverNow in µs.
func (c *serverClock) serverNowUs(i int) int64 { return c.localUs() + c.offsetOf(i) }

// surelyUs is the earliest the clock of shard i's primary may read now,
// µs: a task due by it is due, whatever the estimate's error.
func (c *serverClock) surelyUs(i int) int64 {
	if i >= 0 && i < len(c.clocked) && c.clocked[i].Load() {
		return c.localUs() + c.sures[i].Load()
	}
	return c.localUs() + c.sure.Load()
}

// offsetOf is the Redis clock of shard i's primary minus the local clock, µs.
func (c *serverClock) offsetOf(i int) int64 {
	if i >= 0 && i < len(c.clocked) && c.clocked[i].Load() {
		return c.offsets[i].Load()
	}
	return c.offset.Load()
}

// observe updates shard i's clock offset from a server time read
// between before and after. The server read it somewhere in that round
// trip, so taking the midpoint is off by up to half of it: a sample from
// a slower round trip than the one the offset came from is ignored, unless
// that one is old enough for the clocks to have drifted apart (allowed
// for generously, at 1 ms per second).
func (c *serverClock) observe(i int, serverUs int64, before, after time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rtt := after.Sub(before)
	half := rtt.Microseconds()/2 + 1 // and the µs TIME was cut to
	off := serverUs - (c.local(before) + rtt.Microseconds()/2)
	if i < 0 || i >= len(c.clocked) {
		c.offset.Store(off)
		c.sure.Store(off - half)
		return
	}
	if c.clocked[i].Load() && rtt > c.rtt[i]+after.Sub(c.at[i])/1000 {
		// A slower sample, unless it shows the offset kept is wrong (a
		// clock was stepped): the server's reading must fall in the round
		// trip, give or take a ms of drift.
		cur := c.offsets[i].Load()
		if serverUs >= c.local(before)+cur-1000 && serverUs <= c.local(after)+cur+1000 {
			return
		}
	}
	c.rtt[i], c.at[i] = rtt, after
	c.offset.Store(off)
	c.sure.Store(off - half)
	c.offsets[i].Store(off)
	c.sures[i].Store(off - half)
	c.clocked[i].Store(true)
}
