package main

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/dispatcher/dispatcher/internal/instances"
)

// TestWholeLines: /readyz says each queue as a whole, that a queue is
// paused (from the sweeping instance's record), and each live instance
// once, over all its queues.
func TestWholeLines(t *testing.T) {
	a := instances.Record{ID: "a:1:ab", SeenMs: 10_000, Host: "a", PID: 1, Version: "v1", Sweeps: true, Paused: 16,
		SpanMs: 60_000, Published: 600, Late: instances.Late{{UpTo: 0.002, Count: 98}, {UpTo: math.Inf(1), Count: 2}}}
	b := instances.Record{ID: "b:2:cd", SeenMs: 7_500, Host: "b", PID: 2, Version: "v1", SpanMs: 30_000, Published: 300, Errors: 3}
	mailB := b
	mailB.Sweeps, mailB.Paused = true, 0
	got := wholeLines([]instances.Queue{
		{Name: "orders", NowMs: 10_000, Records: []instances.Record{a, b}},
		{Name: "mail", NowMs: 10_000, Records: []instances.Record{mailB}, Err: errors.New("read: i/o timeout")},
		{Name: "idle", NowMs: 10_000},
	}, "a:1:ab")
	want := []string{
		"queue orders: 2 live instances, swept by a:1:ab; published 20.0/s over the last 1m0s; lateness p50 ≤2ms, p99 >2ms; 3 errors",
		"queue orders: paused (16 shards): nothing is claimed until `dispatcher resume --queue orders`",
		"queue mail: 1 live instance, swept by b:2:cd; published 10.0/s over the last 30s; 3 errors; the other instances' records cannot be read: read: i/o timeout",
		"queue idle: 0 live instances, swept by none of them; published 0.00/s over the last 0s",
		"instance a:1:ab (this one): host a, pid 1, version v1; sweeps orders; last seen now",
		"instance b:2:cd: host b, pid 2, version v1; sweeps mail; last seen 2.5s ago",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("wholeLines:\n%q\nwant\n%q", got, want)
	}
}
