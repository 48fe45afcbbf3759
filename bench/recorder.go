package bench

import (
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/shard"
)

// recorder keeps what the consumer received in one measurement: for the
// first delivery of each expected task its lateness and shard, and counts
// of everything else. Only the consumer goroutine writes the slices; they
// are read after it has stopped. The counters may be read at any time.
type recorder struct {
	expected int // tasks 0..expected-1 are expected
	shards   int
	// earlyUs: a delivery counts as early when its lateness is below
	// this (µs); it allows for the offset between Redis's clock, which
	// decides when a task is due, and the local one, which stamps receipt.
	earlyUs int64

	seen    []uint64 // bitset over task indexes
	late    []int32  // µs, receipt minus due, first deliveries in arrival order
	shardOf []uint16

	unique, dups, unexpected, malformed, badID, early atomic.Int64
	firstNs, lastNs                                   atomic.Int64
}

func newRecorder(expected, shards int, earlyUs int64) *recorder {
	return &recorder{
		expected: expected, shards: shards, earlyUs: earlyUs,
		seen:    make([]uint64, (expected+63)/64),
		late:    make([]int32, 0, expected),
		shardOf: make([]uint16, 0, expected),
	}
}

// record takes one delivery received at now.
func (r *recorder) record(d *amqp.Delivery, now time.Time) {
	i, ok := memberIndex(d.Body)
	due, okDue := dueOf(d)
	if !ok || !okDue {
		r.malformed.Add(1)
		return
	}
	// The contract: message_id is XXH64(member) in hex, '-', due ms.
	hash, okHash := idHash(d.MessageId)
	if !okHash || hash != shard.Hash(d.Body) {
		r.badID.Add(1)
	}
	if i >= r.expected {
		r.unexpected.Add(1)
		return
	}
	if r.seen[i/64]&(1<<(i%64)) != 0 {
		r.dups.Add(1)
		return
	}
	r.seen[i/64] |= 1 << (i % 64)
	lateUs := now.UnixMicro() - due*1000
	if lateUs < r.earlyUs {
		r.early.Add(1)
	}
	r.late = append(r.late, int32(max(min(lateUs, math.MaxInt32), math.MinInt32)))
	r.shardOf = append(r.shardOf, uint16(hash%uint64(r.shards)))
	ns := now.UnixNano()
	r.firstNs.CompareAndSwap(0, ns)
	r.lastNs.Store(ns)
	r.unique.Add(1)
}

// dueOf reads the due time from the x-due-ms header, or else from the
// message_id's suffix.
func dueOf(d *amqp.Delivery) (int64, bool) {
	if v, ok := d.Headers["x-due-ms"].(int64); ok {
		return v, true
	}
	_, s, ok := strings.Cut(d.MessageId, "-")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

func idHash(id string) (uint64, bool) {
	h, _, ok := strings.Cut(id, "-")
	if !ok || len(h) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(h, 16, 64)
	return v, err == nil
}

// missing is how many expected tasks never arrived.
func (r *recorder) missing() int { return r.expected - int(r.unique.Load()) }

// span is the time from the first to the last first-delivery.
func (r *recorder) span() time.Duration {
	return time.Duration(r.lastNs.Load() - r.firstNs.Load())
}
