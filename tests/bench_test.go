package tests

import (
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"
)

// Benchmarks of the whole path (producer → Redis → dispatcher process →
// broker → consumer). Run them with:
//
//	go test -run '^$' -bench . -benchtime 1x ./tests/
//
// The dispatcher binary is then built without -race. Figures are reported
// with b.ReportMetric; nothing here asserts a time.

// BenchmarkBacklogThroughput schedules a backlog all due at once and
// measures how fast one dispatcher drains it to a consumer.
func BenchmarkBacklogThroughput(b *testing.B) {
	for _, instances := range []int{1, 2} {
		b.Run(fmt.Sprintf("instances=%d", instances), func(b *testing.B) {
			for n := 0; n < b.N; n++ {
				benchBacklog(b, 100000, instances)
			}
		})
	}
}

func benchBacklog(b *testing.B, tasks, instances int) {
	h := newHarness(b, queueSpec{Name: "bench", Shards: 16})
	prod := h.producer("bench")
	want := scheduleSpread(b, prod, "bl", tasks, time.Now().Add(-time.Minute), time.Second)
	var procs []*proc
	for i := 0; i < instances; i++ {
		procs = append(procs, h.start())
	}
	begin := time.Now()
	got := h.collect("bench", len(want), 5*time.Minute)
	elapsed := time.Since(begin) - 500*time.Millisecond // collect's quiet period
	for _, p := range procs {                           // a clean stop writes DISPATCHER_TEST_CPUPROFILE
		p.signal(syscall.SIGTERM)
		p.wait(20 * time.Second)
	}
	ids, dups := countIDs(got)
	b.ReportMetric(float64(len(ids))/elapsed.Seconds(), "tasks/s")
	b.ReportMetric(float64(dups), "duplicates")
	b.ReportMetric(float64(len(missing(want, ids))), "missing")
}

// BenchmarkSteadyLateness schedules tasks ahead of time at a steady rate
// and reports consumer-side lateness percentiles.
func BenchmarkSteadyLateness(b *testing.B) {
	for _, rate := range []int{2000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for n := 0; n < b.N; n++ {
				benchSteady(b, rate, 10*time.Second)
			}
		})
	}
}

func benchSteady(b *testing.B, rate int, span time.Duration) {
	h := newHarness(b, queueSpec{Name: "steady", Shards: 16})
	h.start()
	time.Sleep(500 * time.Millisecond)
	total := int(float64(rate) * span.Seconds())
	want := scheduleSpread(b, h.producer("steady"), "st", total, time.Now().Add(time.Second), span)
	got := h.collect("steady", total, span+time.Minute)
	ids, dups := countIDs(got)
	var late []time.Duration
	for _, r := range got {
		late = append(late, r.at.Sub(time.UnixMilli(want[r.d.MessageId])))
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	pct := func(p float64) float64 {
		if len(late) == 0 {
			return 0
		}
		return float64(late[int(p*float64(len(late)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
	b.ReportMetric(float64(dups), "duplicates")
	b.ReportMetric(float64(len(missing(want, ids))), "missing")
}
