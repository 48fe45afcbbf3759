// Package reshard changes a queue's shard count M while dispatchers and
// producers keep running.
//
// Start records the new M at P:{Q}:shards (what producers hash with from
// then on) and the change at P:{Q}:reshard. From then until Finish, every
// dispatcher serves the shards of both counts, so a task written with
// either is dispatched on time wherever it is. The Mover moves pending
// tasks due later than its horizon, and dead letters, to their shard by
// the new M. Finish ends the change once the shards the new M no longer
// has are empty; after a shrink it records the retired count, and the
// dispatchers keep moving what late producers still write there.
package reshard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// ErrBusy: another change of the queue's shard count is in progress.
var ErrBusy = errors.New("another change of the shard count is in progress")

// Started says what Start did.
type Started struct {
	From, To int
	// Resumed: the same change was already in progress (a reshard run
	// again after an interruption).
	Resumed bool
	// Same: the queue already has that many shards; nothing to do.
	Same bool
}

// Start starts changing queue keys.Queue's shard count to to, or finds
// the same change in progress. It wakes the dispatchers, which otherwise
// notice within their layout poll.
func Start(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, to int) (Started, error) {
	if to < 1 || to > shard.MaxShards {
		return Started{}, fmt.Errorf("shard count %d out of range 1..%d", to, shard.MaxShards)
	}
	// A paused queue holds claims with a key per shard, which the new
	// shards would lack.
	if n, err := rdb.Exists(ctx, keys.Paused(0)).Result(); err != nil {
		return Started{}, fmt.Errorf("queue %s: check whether it is paused: %w", keys.Queue, err)
	} else if n > 0 {
		return Started{}, fmt.Errorf("queue %s is paused: resume it (`dispatcher resume --queue %s`) before changing its shard count", keys.Queue, keys.Queue)
	}
	res, err := startScript.Run(ctx, rdb, []string{keys.ShardCount(), keys.Reshard(), keys.Retired()},
		to).StringSlice()
	if err != nil {
		return Started{}, fmt.Errorf("queue %s: start the change to %d shards: %w", keys.Queue, to, err)
	}
	num := func(k int) int { n, _ := strconv.Atoi(res[k]); return n }
	switch res[0] {
	case "none":
		return Started{}, fmt.Errorf("queue %s: %w at %s: start a dispatcher for it first", keys.Queue, shard.ErrNoLayout, keys.ShardCount())
	case "busy":
		return Started{}, fmt.Errorf("queue %s: %w (from %d to %d shards): finish it first with `dispatcher reshard finish --queue %s`",
			keys.Queue, ErrBusy, num(1), num(2), keys.Queue)
	case "same":
		return Started{From: num(1), To: to, Same: true}, nil
	}
	Notify(ctx, rdb, keys)
	return Started{From: num(1), To: to, Resumed: res[0] == "resume"}, nil
}

// Notify tells the queue's dispatchers that its layout changed (they
// also poll it, so a lost message costs only that wait).
func Notify(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys) {
	_ = rdb.Publish(ctx, keys.Wake(), shard.WakeLayout).Err()
}

// Finish ends the change to l.Shards, which must be in progress. The
// caller has emptied the retiring shards (Retiring of a pass is 0).
func Finish(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, l shard.Layout) error {
	res, err := finishScript.Run(ctx, rdb, []string{keys.ShardCount(), keys.Reshard(), keys.Retired()}, l.Shards).StringSlice()
	if err != nil {
		return fmt.Errorf("queue %s: finish the change to %d shards: %w", keys.Queue, l.Shards, err)
	}
	switch res[0] {
	case "none":
		return fmt.Errorf("queue %s: no change of the shard count is in progress", keys.Queue)
	case "other":
		return fmt.Errorf("queue %s: the change in progress is to %s shards, not %d", keys.Queue, res[1], l.Shards)
	}
	Notify(ctx, rdb, keys)
	return nil
}

// Status is a change in progress as recorded in Redis.
type Status struct {
	shard.Layout
	Started time.Time `json:"started"`
	// Progress is the sum of the mover's passes so far; LastPass what the
	// last one found (its Near and Retiring are what is left).
	Progress Progress  `json:"progress"`
	LastPass Progress  `json:"last_pass"`
	PassAt   time.Time `json:"last_pass_at"`
	Passes   int64     `json:"passes"`
}

// ReadStatus reads the queue's layout and, during a change, its progress.
func ReadStatus(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys) (Status, error) {
	l, err := shard.ReadLayout(ctx, rdb, keys)
	if err != nil || !l.Changing() {
		return Status{Layout: l}, err
	}
	h, err := rdb.HGetAll(ctx, keys.Reshard()).Result()
	if err != nil {
		return Status{Layout: l}, fmt.Errorf("read %s: %w", keys.Reshard(), err)
	}
	n := func(k string) int64 { v, _ := strconv.ParseInt(h[k], 10, 64); return v }
	st := Status{Layout: l, Started: time.UnixMilli(n("started_ms")), Passes: n("passes"),
		Progress: Progress{Scanned: n("scanned"), Moved: n("moved"), Kept: n("kept"), Raced: n("raced"), DeadMoved: n("dead_moved")},
		LastPass: Progress{Scanned: n("last_scanned"), Moved: n("last_moved"), Near: n("near"), Retiring: n("retiring")}}
	if ms := n("pass_ms"); ms > 0 {
		st.PassAt = time.UnixMilli(ms)
	}
	return st, nil
}

// record adds a pass's figures to the change's record, if it is still in
// progress (a pass after Finish records nothing).
func record(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, p Progress) error {
	return recordScript.Run(ctx, rdb, []string{keys.Reshard()}, time.Now().UnixMilli(),
		p.Scanned, p.Moved, p.Kept, p.Raced, p.DeadMoved, p.Near, p.Retiring).Err()
}

// recordScript: KEYS[1] P:{Q}:reshard; ARGV pass end (ms), scanned,
// moved, kept, raced, dead moved, near, retiring.
var recordScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'passes', 1)
local names = {'scanned', 'moved', 'kept', 'raced', 'dead_moved'}
for i, k in ipairs(names) do redis.call('HINCRBY', KEYS[1], k, ARGV[i + 1]) end
redis.call('HSET', KEYS[1], 'pass_ms', ARGV[1], 'last_scanned', ARGV[2], 'last_moved', ARGV[3], 'near', ARGV[7], 'retiring', ARGV[8])
return 1
`)

// Lock is the mover's lock on one queue: one mover at a time.
type Lock struct {
	rdb   redis.UniversalClient
	key   string
	token string
	ttl   time.Duration
	stop  chan struct{}
	done  chan struct{}
	lost  chan struct{} // closed once the lock may be another's
}

// ErrLockLost: the mover's lock was lost (a renewal found another holder,
// or none succeeded for most of its TTL): moving on could race another
// mover, so the move stops.
var ErrLockLost = errors.New("the mover's lock was lost (Redis too slow, or the process paused, for its TTL)")

// Guard returns ctx, cancelled with ErrLockLost once the lock is lost.
func (l *Lock) Guard(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-l.lost:
			cancel(ErrLockLost)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// LockTTL is how long a mover that died holds the lock.
const LockTTL = 10 * time.Second

// TryLock takes the queue's mover lock, renewing it until Unlock. ok is
// false, with the holder's name, if another mover holds it.
func TryLock(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, name string) (l *Lock, holder string, err error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	token := name + "/" + hex.EncodeToString(b)
	ok, err := rdb.SetNX(ctx, keys.ReshardLock(), token, LockTTL).Result()
	if err != nil {
		return nil, "", fmt.Errorf("take the mover lock %s: %w", keys.ReshardLock(), err)
	}
	if !ok {
		holder, _ = rdb.Get(ctx, keys.ReshardLock()).Result()
		return nil, holder, nil
	}
	l = &Lock{rdb: rdb, key: keys.ReshardLock(), token: token, ttl: LockTTL, stop: make(chan struct{}), done: make(chan struct{}),
		lost: make(chan struct{})}
	go l.renew()
	return l, "", nil
}

func (l *Lock) renew() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), l.ttl/3)
			held, err := lockScript.Run(ctx, l.rdb, []string{l.key}, l.token, l.ttl.Milliseconds()).Int()
			cancel()
			switch {
			case err == nil && held == 1:
				renewed = time.Now()
				continue
			case err == nil || time.Since(renewed) > l.ttl*2/3:
				// Another holds it, or it may have expired unrenewed.
				close(l.lost)
				<-l.stop
				return
			}
		}
	}
}

// Unlock releases the lock.
func (l *Lock) Unlock(ctx context.Context) {
	close(l.stop)
	<-l.done
	_ = lockScript.Run(ctx, l.rdb, []string{l.key}, l.token, 0).Err()
}
