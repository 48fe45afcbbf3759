package bench

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/shard"
)

// recorder keeps what the consumer received in one measurement: for the
// first delivery of each expected task its lateness in two views and its
// shard, and counts of everything else. Only the consumer goroutine writes
// the slices; they are read after it has stopped. The counters may be read
// at any time.
//
// The two views of lateness:
//   - consumer: local receipt time minus due time, what a worker sees;
//   - dispatch: header x-published-us (the Redis-clock time at which the
//     dispatcher began publishing the message's batch) minus due time,
//     what the dispatcher adds before the broker and the consumer do;
//     both on Redis's clock. Only a dispatcher started with
//     DISPATCHER_STAMP_PUBLISHED=true sends the header.
type recorder struct {
	expected int // tasks 0..expected-1 are expected
	shards   int
	// earlyUs: a delivery counts as early when its lateness is below
	// this (µs); it allows for the offset between Redis's clock, which
	// decides when a task is due, and the local one, which stamps receipt.
	earlyUs int64

	seen    []uint64 // bitset over task indexes
	late    []int32  // µs, receipt minus due, first deliveries in arrival order
	disp    []int32  // µs, x-published-us minus due, or noStamp; alongside late
	shardOf []uint16
	// dueMs is each first delivery's due time, alongside late; kept only
	// when asked for (keepDue), for the start-of-traffic window.
	dueMs []int64

	// ids: the tasks were scheduled by id (t<index>), props: with
	// properties (see taskForm); set before anything is recorded.
	ids, props bool
	idBuf      []byte // consumer goroutine's scratch
	traceBuf   []byte
	// ingress: the tasks came through the AMQP ingress (ingress mode):
	// each message's message_id and x-task-id are its task's id, and its
	// x-delay header is delayMs as published; dueByIndex keeps each
	// task's due time (ms, 0 until it arrives) by its index.
	ingress    bool
	delayMs    int64
	dueByIndex []int64

	unique, dups, unexpected, malformed, badID, early atomic.Int64
	// badTaskID counts deliveries whose x-task-id is not their task's id
	// (or is there for a plain member), or whose properties did not
	// arrive as scheduled.
	badTaskID atomic.Int64
	// unstamped counts first deliveries without x-published-us.
	unstamped       atomic.Int64
	firstNs, lastNs atomic.Int64
	// brokerStamped counts ingress deliveries that carry timestamp_in_ms:
	// the broker's receipt time, which the ingress takes as the base of
	// the due time instead of its own clock reading.
	brokerStamped atomic.Int64
}

// noStamp marks a first delivery without x-published-us in disp.
const noStamp = math.MinInt32

func newRecorder(expected, shards int, earlyUs int64) *recorder {
	return &recorder{
		expected: expected, shards: shards, earlyUs: earlyUs,
		seen:    make([]uint64, (expected+63)/64),
		late:    make([]int32, 0, expected),
		disp:    make([]int32, 0, expected),
		shardOf: make([]uint16, 0, expected),
	}
}

// keepDue makes the recorder keep each first delivery's due time; call
// before anything is recorded.
func (r *recorder) keepDue() { r.dueMs = make([]int64, 0, r.expected) }

// expectIDs says that the tasks were scheduled by id, with properties
// when props; call before anything is recorded.
func (r *recorder) expectIDs(props bool) { r.ids, r.props = true, props }

// expectIngress says that the tasks came through the AMQP ingress, each
// published with x-delay delayMs; call before anything is recorded.
func (r *recorder) expectIngress(delayMs int64) {
	r.ids, r.ingress, r.delayMs = true, true, delayMs
	r.dueByIndex = make([]int64, r.expected)
}

// record takes one delivery received at now.
func (r *recorder) record(d *amqp.Delivery, now time.Time) {
	i, ok := memberIndex(d.Body)
	due, okDue := dueOf(d)
	if !ok || !okDue {
		r.malformed.Add(1)
		return
	}
	// The contract: message_id is XXH64(member) in hex, '-', due ms; the
	// member is the task's id when it has one.
	member := d.Body
	gotID, hasID := d.Headers["x-task-id"].(string)
	if r.ids {
		r.idBuf = taskID(r.idBuf, i)
		member = r.idBuf
		if !hasID || gotID != string(r.idBuf) || (r.props && !r.propsArrived(d, i)) {
			r.badTaskID.Add(1)
		} else if delay, ok := intHeader(d.Headers, "x-delay"); r.ingress && (!ok || delay != r.delayMs) {
			r.badTaskID.Add(1) // the producer's header did not arrive as sent
		}
	} else if _, ok := d.Headers["x-task-id"]; ok {
		r.badTaskID.Add(1)
	}
	var hash uint64
	if r.ingress {
		// The producer's message_id, kept as it was.
		hash = shard.Hash(member)
		if d.MessageId != string(member) {
			r.badID.Add(1)
		}
		if _, ok := d.Headers["timestamp_in_ms"]; ok {
			r.brokerStamped.Add(1)
		}
	} else {
		h, ok := idHash(d.MessageId)
		if !ok || h != shard.Hash(member) {
			r.badID.Add(1)
		}
		hash = h
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
	r.late = append(r.late, clamp32(lateUs, math.MinInt32))
	if pub, ok := intHeader(d.Headers, "x-published-us"); ok {
		r.disp = append(r.disp, clamp32(pub-due*1000, noStamp+1))
	} else {
		r.disp = append(r.disp, noStamp)
		r.unstamped.Add(1)
	}
	if r.dueMs != nil {
		r.dueMs = append(r.dueMs, due)
	}
	if r.dueByIndex != nil {
		r.dueByIndex[i] = due
	}
	r.shardOf = append(r.shardOf, uint16(hash%uint64(r.shards)))
	ns := now.UnixNano()
	r.firstNs.CompareAndSwap(0, ns)
	r.lastNs.Store(ns)
	r.unique.Add(1)
}

// propsArrived says whether the delivery carries task i's traceparent
// (its trace id: a tracer may make itself the parent).
func (r *recorder) propsArrived(d *amqp.Delivery, i int) bool {
	tp, _ := d.Headers["traceparent"].(string)
	r.traceBuf = traceID(r.traceBuf[:0], i)
	return traceIDOf(tp) == string(r.traceBuf)
}

func clamp32(v int64, lo int32) int32 { return int32(max(min(v, math.MaxInt32), int64(lo))) }

// intHeader reads an integer header. amqp091-go hands AMQP's long-long
// ints over as int64 and long ints as int32; the others are taken too, in
// case a broker or a plugin narrows or widens the value on the way.
func intHeader(h amqp.Table, name string) (int64, bool) {
	switch v := h[name].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int:
		return int64(v), true
	case int16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint16:
		return int64(v), true
	}
	return 0, false
}

// dueOf reads the due time from the x-due-ms header, or else from the
// message_id's suffix.
func dueOf(d *amqp.Delivery) (int64, bool) {
	if v, ok := intHeader(d.Headers, "x-due-ms"); ok {
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

// views returns the lateness samples of the first deliveries for which
// keep (nil: all) is true: the consumer view, and the dispatch view of
// those that carried x-published-us.
func (r *recorder) views(keep func(i int) bool) (consumer, dispatch []int32) {
	if keep == nil {
		consumer = r.late
	}
	for i, v := range r.late {
		if keep != nil && !keep(i) {
			continue
		}
		if keep != nil {
			consumer = append(consumer, v)
		}
		if p := r.disp[i]; p != noStamp {
			dispatch = append(dispatch, p)
		}
	}
	return consumer, dispatch
}

// startWindow returns the first deliveries' lateness for the tasks due
// within span of the earliest due time recorded: both views, and that
// earliest due time. It needs keepDue; ok is false without it or when
// nothing arrived.
func (r *recorder) startWindow(span time.Duration) (consumer, dispatch []int32, firstDueMs int64, ok bool) {
	if len(r.dueMs) == 0 || len(r.dueMs) != len(r.late) {
		return nil, nil, 0, false
	}
	firstDueMs = slices.Min(r.dueMs)
	end := firstDueMs + span.Milliseconds()
	consumer, dispatch = r.views(func(i int) bool { return r.dueMs[i] < end })
	return consumer, dispatch, firstDueMs, true
}

// afterWindow is startWindow's complement: the tasks due from span after
// the earliest due time on (the steady traffic after its start); they are
// due in [fromMs, fromMs+ms).
func (r *recorder) afterWindow(span time.Duration) (consumer, dispatch []int32, fromMs, ms int64, ok bool) {
	if len(r.dueMs) == 0 || len(r.dueMs) != len(r.late) {
		return nil, nil, 0, 0, false
	}
	fromMs = slices.Min(r.dueMs) + span.Milliseconds()
	consumer, dispatch = r.views(func(i int) bool { return r.dueMs[i] >= fromMs })
	return consumer, dispatch, fromMs, slices.Max(r.dueMs) + 1 - fromMs, len(consumer) > 0
}

// missing is how many expected tasks never arrived.
func (r *recorder) missing() int { return r.expected - int(r.unique.Load()) }

// span is the time from the first to the last first-delivery.
func (r *recorder) span() time.Duration {
	return time.Duration(r.lastNs.Load() - r.firstNs.Load())
}
