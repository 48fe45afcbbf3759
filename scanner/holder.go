package scanner

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// A claim takes tasks due within the look-ahead (Options.Lookahead), so
// that steady traffic is claimed in batches rather than task by task. The
// holder keeps the tasks claimed before their due time and hands each to
// the publisher at its due time by the Redis clock of its shard, never
// before; what falls due in the same instant goes out in one publish.
//
// A binary heap, not a timing wheel: it holds at most PIPELINE ×
// BATCH_SIZE tasks (the loop stops claiming ahead beyond that), needs µs-exact deadlines
// (a wheel's tick would make tasks late by up to a tick, or early), and
// one timer for its earliest task. A wheel pays off for millions of
// coarse timers, which this is not.
//
// If the process dies, the held tasks are in flight under their claim's
// lease, which brings them back as any claimed task. On a clean stop the
// holder returns everything it still holds, which goes back into pending
// (Scanner.handBack).
type holder struct {
	// serverUs is the earliest the Redis clock of a shard's primary may
	// read now, µs (the estimate less its error): never early.
	serverUs func(shard int) int64
	// localUs is the local clock, µs (Options.Now).
	localUs func() int64
	// fire publishes tasks that fell due; called on a goroutine of its own.
	fire func([]heldTask)
	// confirmed reports whether a reading of shard's Redis clock taken
	// after heldUs shows dueUs; if not, it asks for one and wake is called
	// when it comes (clockCheck.due). nil: the estimate decides alone.
	confirmed func(shard int, dueUs, heldUs int64) bool
	// tick, µs: tasks go out at the first multiple of it (server clock) at
	// or after their due time, so that those of one tick share a publish
	// (0: each at its due time).
	tick int64

	mu      sync.Mutex
	items   heldHeap
	waiting []*heldTask // due by the estimate, waiting for a reading of the clock
	stopped bool
	kick    chan struct{}
}

// maxFireWorkers is how many publishes of held tasks may wait for their
// confirms on long-lived goroutines; more run on goroutines of their own.
const maxFireWorkers = 8

// heldTask is one task held until its due time, and the batch it counts in.
type heldTask struct {
	task  Task
	batch *progress
	at    int64 // local µs at which it is due, by the offset known when held
	held  int64 // local µs at which it was held: a reading must come after
}

func newHolder(serverUs func(int) int64, localUs func() int64, fire func([]heldTask), tick time.Duration) *holder {
	return &holder{serverUs: serverUs, localUs: localUs, fire: fire, kick: make(chan struct{}, 1), tick: tick.Microseconds()}
}

// goesAt is when (server clock, µs) t goes out: its due time, or the end
// of its tick.
func (h *holder) goesAt(t *heldTask) int64 {
	at := t.task.DueMs * 1000
	if h.tick > 0 {
		at += (h.tick - at%h.tick) % h.tick
	}
	return at
}

// add holds tasks until their due time. After the holder stopped it holds
// nothing: the tasks are returned for the caller to hand back.
func (h *holder) add(tasks []heldTask) []heldTask {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return tasks
	}
	earliest := len(h.items) == 0
	now := h.localUs()
	held := make([]heldTask, len(tasks)) // one allocation for the batch; the heap moves pointers
	for n := range tasks {
		t := &held[n]
		*t = tasks[n]
		t.at, t.held = h.localAt(t), now
		earliest = earliest || t.at < h.items[0].at
		heap.Push(&h.items, t)
	}
	h.mu.Unlock()
	if earliest {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// localAt is when, on the local clock, t's shard's Redis clock reaches its
// due time.
func (h *holder) localAt(t *heldTask) int64 {
	return h.goesAt(t) - (h.serverUs(t.batch.b.shard) - h.localUs())
}

// len is how many tasks the holder holds.
func (h *holder) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.items) + len(h.waiting)
}

// wake makes the holder look at its tasks again (a reading of the clock
// came).
func (h *holder) wake() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// run hands tasks to fire as they fall due, until ctx ends; then it stops
// and returns what it still held.
func (h *holder) run(ctx context.Context) []heldTask {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	// Publishes go to long-lived workers: a goroutine per publish grew its
	// stack anew every time (a tenth of the CPU at 2,000 tasks/s). When
	// all are busy (each waits for its confirms), a new one starts: a
	// task must not wait for another's confirm.
	fires := make(chan []heldTask)
	defer close(fires)
	workers := 0
	for {
		due, next, ok := h.take()
		if len(due) > 0 {
			select {
			case fires <- due:
			default:
				if workers < maxFireWorkers {
					workers++
					go func() {
						for due := range fires {
							h.fire(due)
						}
					}()
				}
				go h.fire(due)
			}
		}
		wait := time.Hour
		if ok {
			wait = time.Duration(next-h.localUs()) * time.Microsecond
		}
		t.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			h.mu.Lock()
			defer h.mu.Unlock()
			h.stopped = true
			left := make([]heldTask, 0, len(h.items)+len(h.waiting))
			for _, t := range append(h.items, h.waiting...) {
				left = append(left, *t)
			}
			h.items, h.waiting = nil, nil
			return left
		case <-h.kick:
		case <-t.C:
		}
	}
}

// take pops every task due now by its shard's Redis clock, and reports
// when the earliest task left is due (local µs), if any. Tasks due by the
// estimate wait aside until a reading of the clock confirms them (a
// reading wakes the holder).
func (h *holder) take() (due []heldTask, next int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.localUs()
	for _, t := range h.waiting {
		heap.Push(&h.items, t) // their time has come: looked at again below
	}
	clear(h.waiting) // each pointer keeps its whole batch alive
	h.waiting = h.waiting[:0]
	var later []*heldTask
	for len(h.items) > 0 && h.items[0].at <= now {
		t := heap.Pop(&h.items).(*heldTask)
		if h.serverUs(t.batch.b.shard) < h.goesAt(t) {
			// The clock estimate moved since it was held: not due yet.
			t.at = max(h.localAt(t), now+100)
			later = append(later, t)
			continue
		}
		if h.confirmed != nil && !h.confirmed(t.batch.b.shard, h.goesAt(t), t.held) {
			h.waiting = append(h.waiting, t)
			continue
		}
		due = append(due, *t)
	}
	for _, t := range later {
		heap.Push(&h.items, t)
	}
	if len(h.items) > 0 {
		return due, h.items[0].at, true
	}
	return due, 0, false
}

// heldHeap orders held tasks by due time (container/heap). Pointers, not
// the tasks: a task is a hundred bytes and more, which each swap copied
// and each Push and Pop boxed anew.
type heldHeap []*heldTask

func (q heldHeap) Len() int           { return len(q) }
func (q heldHeap) Less(i, j int) bool { return q[i].at < q[j].at }
func (q heldHeap) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *heldHeap) Push(x any)        { *q = append(*q, x.(*heldTask)) }
func (q *heldHeap) Pop() any {
	old := *q
	x := old[len(old)-1]
	old[len(old)-1] = nil // the batch it points into can go once its tasks are out
	*q = old[:len(old)-1]
	return x
}
