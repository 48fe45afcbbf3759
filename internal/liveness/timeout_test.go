package liveness

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recordOf runs an instance with timeout until its first heartbeat and
// returns its record without the leading heartbeat time (its own
// format), after stopping it.
func recordOf(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	rdb, _, _, _ := fresh(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := New(rdb, Options{Prefix: prefix + "-model", ID: "m", Timeout: timeout, Queues: []string{"q"}})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	var v string
	waitFor(t, "a heartbeat", 2*time.Second, func() bool {
		v = rdb.HGet(ctx, Key(prefix+"-model"), l.ID()).Val()
		return v != ""
	})
	cancel()
	<-done
	i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	return v[i:]
}

// TestJudgeUsesTheJudgedInstancesTimeout: in a fleet whose instances have
// different timeouts (a rolling change of it), an instance is judged by
// its own timeout, the one it fences itself by: one with a longer timeout
// than its judge's is not declared dead while it may still publish, and
// one with a shorter one is declared dead as soon as its own timeout says.
func TestJudgeUsesTheJudgedInstancesTimeout(t *testing.T) {
	rdb, prefix, ctx, cancel := fresh(t)
	defer cancel()
	slow := recordOf(t, prefix, 4*time.Second)
	fast := recordOf(t, prefix, 400*time.Millisecond)
	var short, long deaths
	judges := []*Liveness{
		New(rdb, Options{Prefix: prefix, ID: "short", Timeout: 400 * time.Millisecond, OnDead: short.add}),
		New(rdb, Options{Prefix: prefix + "-long", ID: "long", Timeout: 20 * time.Second, OnDead: long.add}),
	}
	done := make(chan struct{}, len(judges))
	for _, l := range judges {
		go func() { defer func() { done <- struct{}{} }(); _ = l.Run(ctx) }()
	}
	// Judges judge once their own heartbeats went through for the judged
	// instance's timeout (4 s at most here).
	time.Sleep(4500 * time.Millisecond)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms := func(ago time.Duration) string { return strconv.FormatInt(now.Add(-ago).UnixMilli(), 10) }
	// Silent, and no connection left: judged by the age of their records.
	rdb.HSet(ctx, Key(prefix),
		"slow-young#0", ms(time.Second)+slow, // under half its 4 s: may publish
		"slow-old#0", ms(6*time.Second)+slow)
	rdb.HSet(ctx, Key(prefix+"-long"), "fast#0", ms(time.Second)+fast) // over its 400 ms
	waitFor(t, "the old record of the slow instance declared dead", 3*time.Second, func() bool { return short.has("slow-old#0") })
	// The long judge's heartbeat comes every 5 s; it must find the fast
	// instance dead at its first one, not 20 s after that one's heartbeat.
	waitFor(t, "the fast instance declared dead", 3*time.Second, func() bool { return long.has("fast#0") })
	time.Sleep(500 * time.Millisecond)
	if short.has("slow-young#0") || long.has("slow-young#0") {
		t.Error("an instance with a 4 s timeout was declared dead 1.5 s after its heartbeat, by a judge with a 400 ms one: it may still be publishing")
	}
	cancel()
	for range judges {
		<-done
	}
}
