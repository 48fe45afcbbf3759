package tests

import (
	"sync"
	"time"
)

// outcome is what one fault test measured: the figures of the README's
// fault table.
type outcome struct {
	Scheduled, Delivered, Missing, Duplicates int
	WorstLate                                 time.Duration // consumer receipt minus due, worst task
	Early                                     int           // deliveries received before their due time
}

// verify collects queue's deliveries until every wanted task arrived (or
// timeout), logs the figures in one FAULT line that the README table is
// built from, and fails the test if a task is missing, one arrived early,
// or there were more than maxDups duplicates. want maps message_id to due
// time in ms, as scheduleSpread returns it.
func (h *harness) verify(queue string, want map[string]int64, timeout time.Duration, maxDups int) outcome {
	h.t.Helper()
	got := h.collect(queue, len(want), timeout)
	h.mu.Lock()
	h.delivered[queue] = got
	h.mu.Unlock()
	ids, dups := countIDs(got)
	miss := missing(want, ids)
	o := outcome{Scheduled: len(want), Delivered: len(ids), Missing: len(miss), Duplicates: dups}
	for _, r := range got {
		due, ok := want[r.d.MessageId]
		if !ok {
			continue
		}
		// 1 ms of slack: the consumer's clock reading is truncated to ms.
		late := r.at.Sub(time.UnixMilli(due))
		if late < -time.Millisecond {
			o.Early++
		}
		o.WorstLate = max(o.WorstLate, late)
	}
	name := h.t.Name()
	if len(h.queues) > 1 {
		name += " queue " + queue
	}
	h.t.Logf("FAULT %s: scheduled=%d delivered=%d missing=%d duplicates=%d worst_late_ms=%d early=%d",
		name, o.Scheduled, o.Delivered, o.Missing, o.Duplicates, o.WorstLate.Milliseconds(), o.Early)
	if o.Missing > 0 {
		h.t.Errorf("%d of %d tasks never arrived, e.g. %v", o.Missing, o.Scheduled, first(miss))
	}
	if o.Early > 0 {
		h.t.Errorf("%d deliveries arrived before their due time", o.Early)
	}
	if o.Duplicates > maxDups {
		h.t.Errorf("%d duplicates, more than the %d this fault may cause", o.Duplicates, maxDups)
	}
	if len(ids) > len(want) {
		h.t.Errorf("received %d distinct ids, only %d scheduled", len(ids), len(want))
	}
	return o
}

// verifyWhile runs faults while verify collects the deliveries: receipt
// times make the lateness figures, so collecting cannot wait for the
// faults to end.
func verifyWhile(h *harness, queue string, want map[string]int64, timeout time.Duration, maxDups int, faults func()) outcome {
	h.t.Helper()
	var o outcome
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); o = h.verify(queue, want, timeout, maxDups) }()
	defer wg.Wait() // also when faults ends the test early
	faults()
	wg.Wait()
	return o
}
