package scanner

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A held task goes out only once a reading of its shard's Redis clock,
// taken after the task was held, shows its due time. The estimate of the
// Redis clock (serverClock) times the holder, but it cannot see the clock
// step back (an NTP step, a failover to a primary whose clock is behind)
// until the next reading: the tasks it releases would go out before their
// due time by the clock as it now reads. So when held tasks fall due by
// the estimate, one TIME is sent to their primary (one at a time per
// primary, shared by every task of that instant, and at most one per
// gap), unless a claim's reading already shows them due; a reading that shows them not due corrects the
// estimate, and the holder waits again.

// clockCheck confirms, by readings of the Redis clock, that held tasks are
// due. Safe for concurrent use: the holder asks, readings come from their
// own goroutines and from the loop's claims.
type clockCheck struct {
	clock *serverClock
	// node names the primary of shard i and returns a client that sends
	// TIME to it.
	node func(ctx context.Context, i int) (string, redis.Cmdable, error)
	wake func() // tells the holder a reading came
	// gap is the least time between two TIMEs of this instance to one
	// primary (DISPATCHER_CLOCK_READ_GAP). Under steady traffic held
	// tasks fall due every ms or so, and a TIME for each instant would be
	// most of the instance's CPU and of its Redis commands; at most one
	// per gap, the tasks of the instants in between wait for the next
	// one. Quiet traffic, whose readings are further apart, waits for
	// nothing.
	gap time.Duration
	lim *logLimiter
	met queueMetrics

	mu      sync.Mutex
	readers sync.WaitGroup
	nodes   map[string]*reading
	stopped bool
	quit    chan struct{} // closed by stop: the readers end
}

// reading is the last reading of one primary's clock, and the goroutine
// that reads it: one that lives while readings are asked for, not one per
// reading, which under steady traffic (a reading every gap) grew a new
// stack through go-redis each time, most of the check's CPU.
type reading struct {
	serverUs int64     // what it read, µs
	sentUs   int64     // local µs at which its request was sent: it was taken after
	busy     bool      // a TIME is on its way
	lastTIME time.Time // when this instance's last TIME to it was (to be) sent
	shards   map[int]bool
	// The reader: running while its goroutine lives; kick asks it for
	// the next reading, of shard i through cl (nodeErr: the node could
	// not be named), after wait.
	running bool
	kick    chan struct{}
	i       int
	cl      redis.Cmdable
	nodeErr error
	wait    time.Duration
}

// readerIdle is how long a primary's reader waits for the next ask
// before it ends (a quiet queue keeps no goroutine for it).
const readerIdle = time.Minute

func newClockCheck(clock *serverClock, node func(context.Context, int) (string, redis.Cmdable, error), lim *logLimiter, met queueMetrics) *clockCheck {
	return &clockCheck{clock: clock, node: node, lim: lim, met: met, wake: func() {}, nodes: map[string]*reading{}, quit: make(chan struct{})}
}

// readingOf returns the reading of primary addr (mu held).
func (c *clockCheck) readingOf(addr string) *reading {
	r := c.nodes[addr]
	if r == nil {
		r = &reading{shards: map[int]bool{}, kick: make(chan struct{}, 1)}
		c.nodes[addr] = r
	}
	return r
}

// due reports whether a reading of shard i's Redis clock taken after heldUs
// (local µs) read dueUs or later. If none did, it asks for one, and the
// holder is woken when it comes.
func (c *clockCheck) due(i int, dueUs, heldUs int64) bool {
	addr, cl, err := c.node(context.Background(), i)
	if err != nil {
		addr, cl = "shard "+strconv.Itoa(i), nil // read (and fail) on its own
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.readingOf(addr)
	if r.sentUs >= heldUs && r.serverUs >= dueUs {
		return true
	}
	r.shards[i] = true
	if !r.busy && !c.stopped {
		r.busy = true
		wait := max(time.Until(r.lastTIME.Add(c.gap)), 0)
		r.lastTIME = time.Now().Add(wait) // when this one goes
		r.i, r.cl, r.nodeErr, r.wait = i, cl, err, wait
		if !r.running {
			r.running = true
			c.readers.Add(1)
			go c.reader(addr, r)
		}
		r.kick <- struct{}{} // room: one ask at a time (busy)
	}
	return false
}

// reader reads primary addr's clock each time it is asked, until stop, or
// until it was not asked for readerIdle.
func (c *clockCheck) reader(addr string, r *reading) {
	defer c.readers.Done()
	idle := time.NewTimer(readerIdle)
	defer idle.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-idle.C:
			c.mu.Lock()
			if len(r.kick) == 0 {
				r.running = false
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			continue // asked as the timer fired: take the ask
		case <-r.kick:
		}
		c.mu.Lock()
		i, cl, nodeErr, wait := r.i, r.cl, r.nodeErr, r.wait
		c.mu.Unlock()
		c.read(i, addr, cl, nodeErr, r, wait)
		idle.Reset(readerIdle)
	}
}

// primaryOf names the primary of shard i now ("" if not known), for note.
func (c *clockCheck) primaryOf(i int) string {
	addr, _, err := c.node(context.Background(), i)
	if err != nil {
		return ""
	}
	return addr
}

// note takes a reading of shard i's clock that another request made (a
// claim or a sweep sent at before to sentTo, named by primaryOf before it
// was sent).
func (c *clockCheck) note(i int, serverUs int64, before time.Time, sentTo string) {
	addr, _, err := c.node(context.Background(), i)
	if err != nil || addr != sentTo {
		// The shard moved to another primary while the request was out
		// (a failover): whose clock it read is not known. Left out; the
		// holder sends a TIME of its own if it needs one.
		return
	}
	sent := c.clock.local(before)
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.readingOf(addr); sent > r.sentUs {
		r.serverUs, r.sentUs = serverUs, sent
	}
}

// read sends one TIME to primary addr, feeds what it reads to the estimate
// of the waiting shards' clocks, and wakes the holder. A failed read is
// tried again after a pause: the tasks stay held meanwhile (their lease
// covers a Redis that does not answer, as for any claimed task).
func (c *clockCheck) read(i int, addr string, cl redis.Cmdable, nodeErr error, r *reading, wait time.Duration) {
	if wait > 0 {
		time.Sleep(wait) // the gap; busy meanwhile, so the waiting shards share this one
	}
	var tm time.Time
	err := nodeErr
	before := c.clock.now()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), counterTimeout)
		tm, err = cl.Time(ctx).Result()
		cancel()
	}
	after := c.clock.now()
	if err != nil {
		c.met.error("redis", 1)
		c.lim.Warn("clockcheck:"+addr, "cannot read the Redis clock to confirm held tasks are due; they wait", "shard", i, "err", err)
		time.Sleep(100 * time.Millisecond)
	}
	c.mu.Lock()
	shards := r.shards
	r.shards, r.busy = map[int]bool{}, false
	if err == nil && c.clock.local(before) > r.sentUs {
		r.serverUs, r.sentUs = tm.UnixMicro(), c.clock.local(before)
	}
	c.mu.Unlock()
	if err == nil {
		for sh := range shards {
			c.clock.observe(sh, tm.UnixMicro(), before, after)
		}
	}
	c.wake()
}

// stop lets no more reads start and waits for those on their way.
func (c *clockCheck) stop() {
	c.mu.Lock()
	if !c.stopped {
		c.stopped = true
		close(c.quit)
	}
	c.mu.Unlock()
	c.readers.Wait()
}

// clockNode names the primary of shard i and returns a client whose TIME
// goes to it: on Redis Cluster the master of the shard's slot, otherwise
// the one server (or the primary Sentinel names).
func (s *Scanner) clockNode(ctx context.Context, i int) (string, redis.Cmdable, error) {
	if s.rdb == nil {
		return "", nil, errors.New("no Redis client")
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		cl, err := cc.MasterForKey(ctx, s.keys.Pending(i))
		if err != nil {
			return "", nil, err
		}
		return cl.Options().Addr, cl, nil
	}
	return "", s.rdb, nil
}
