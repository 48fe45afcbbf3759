package shard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// idState is what Redis holds of id in shard i: its score (0: not
// pending), body and properties ("" and false when absent).
type idState struct {
	score         int64
	body, props   string
	hasBody, hasP bool
}

func stateOf(t *testing.T, rdb *redis.Client, k shard.Keys, i int, id string) idState {
	t.Helper()
	ctx := context.Background()
	var s idState
	if sc, err := rdb.ZScore(ctx, k.Pending(i), id).Result(); err == nil {
		s.score = int64(sc)
	} else if !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	b, err := rdb.HGet(ctx, k.Tasks(i), id).Result()
	s.body, s.hasBody = b, err == nil
	pr, err := rdb.HGet(ctx, k.Props(i), id).Result()
	s.props, s.hasP = pr, err == nil
	return s
}

func TestScheduleID(t *testing.T) {
	ctx := context.Background()
	const m = 16
	rdb, _, p := setup(t, m)
	p.SetWakeWithin(0)
	k := p.Keys()
	id := "order-42:timeout"
	i := shard.Index([]byte(id), m)
	prio := 5
	props := &shard.Properties{RoutingKey: "orders.timeout", Priority: &prio, Headers: map[string]any{"tenant": "acme", "attempt": 2}}
	due := time.UnixMilli(1767225600000)
	body := []byte{0, 1, 0xff, '\n'}
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte(id), Body: body, Props: props, Due: due}); err != nil {
		t.Fatal(err)
	}
	got := stateOf(t, rdb, k, i, id)
	wantProps := `{"routing_key":"orders.timeout","headers":{"attempt":2,"tenant":"acme"},"priority":5}`
	if got.score != 1767225600000 || got.body != string(body) || got.props != wantProps {
		t.Fatalf("after ScheduleID, shard %d holds %+v; want score 1767225600000, body %q, props %s", i, got, body, wantProps)
	}

	// Again, without properties: body, due time replaced, properties gone.
	later := due.Add(time.Hour)
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte(id), Body: []byte("v2"), Due: later}); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, rdb, k, i, id); got.score != later.UnixMilli() || got.body != "v2" || got.hasP {
		t.Fatalf("scheduled again without properties: %+v", got)
	}
	// Zero properties are none.
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte(id), Body: []byte("v3"), Props: &shard.Properties{}, Due: later}); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, rdb, k, i, id); got.body != "v3" || got.hasP {
		t.Fatalf("scheduled with zero properties: %+v", got)
	}
	if n := pendingCount(t, rdb, k.Prefix, "orders", m); n != 1 {
		t.Fatalf("%d pending, want 1", n)
	}

	// Bad input: an error naming it, nothing written.
	badPrio := 300
	for _, tc := range []struct {
		task shard.IDTask
		err  string
	}{
		{shard.IDTask{ID: nil, Body: []byte("b"), Due: due}, "task id of 0 bytes: must be 1 to 1024 bytes"},
		{shard.IDTask{ID: make([]byte, 1025), Body: []byte("b"), Due: due}, "task id of 1025 bytes"},
		{shard.IDTask{ID: []byte("x"), Body: []byte("b"), Props: &shard.Properties{Priority: &badPrio}, Due: due}, "priority 300 is not 0 to 255"},
		{shard.IDTask{ID: []byte("x"), Body: []byte("b"), Props: &shard.Properties{Headers: map[string]any{"x-task-id": "y"}}, Due: due}, `"x-task-id" is reserved`},
	} {
		err := p.ScheduleID(ctx, tc.task)
		if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "nothing scheduled") {
			t.Errorf("ScheduleID(%.20q) = %v; want an error with %q", tc.task.ID, err, tc.err)
		}
	}
	if n := pendingCount(t, rdb, k.Prefix, "orders", m); n != 1 {
		t.Fatalf("bad tasks wrote something: %d pending, want 1", n)
	}
	// 1024 bytes is the longest id.
	long := strings.Repeat("i", shard.MaxIDBytes)
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte(long), Body: []byte("b"), Due: due}); err != nil {
		t.Fatalf("an id of 1024 bytes: %v", err)
	}
}

func TestScheduleIDs(t *testing.T) {
	ctx := context.Background()
	const m, count = 8, 300
	rdb, _, p := setup(t, m)
	p.SetWakeWithin(0)
	k := p.Keys()
	base := time.UnixMilli(1767225600000)
	tasks := make([]shard.IDTask, count)
	for n := range tasks {
		tasks[n] = shard.IDTask{ID: []byte(fmt.Sprintf("job-%d", n)), Body: []byte(fmt.Sprintf("body %d", n)), Due: base.Add(time.Duration(n) * time.Millisecond)}
		if n%2 == 0 {
			tasks[n].Props = &shard.Properties{CorrelationID: fmt.Sprint(n)}
		}
	}
	// One bad task: nothing written.
	bad := append(append([]shard.IDTask{}, tasks...), shard.IDTask{ID: nil, Body: []byte("x")})
	if err := p.ScheduleIDs(ctx, bad); err == nil || !strings.Contains(err.Error(), "task 301 of 301: task id of 0 bytes") {
		t.Fatalf("ScheduleIDs with an empty id = %v", err)
	}
	if n := pendingCount(t, rdb, k.Prefix, "orders", m); n != 0 {
		t.Fatalf("a refused batch wrote %d tasks", n)
	}
	// The commands ScheduleIDsThen is given run after the write.
	var seen []*redis.FloatCmd
	if err := p.ScheduleIDsThen(ctx, tasks, func(pipe redis.Pipeliner) {
		seen = seen[:0]
		for _, task := range tasks {
			seen = append(seen, pipe.ZScore(ctx, k.Pending(shard.Index(task.ID, m)), string(task.ID)))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != count {
		t.Fatalf("then made %d commands, want %d", len(seen), count)
	}
	for n, c := range seen {
		if v, err := c.Result(); err != nil || int64(v) != tasks[n].Due.UnixMilli() {
			t.Fatalf("%s as then read it: %v %v", tasks[n].ID, v, err)
		}
	}
	for n, task := range tasks {
		got := stateOf(t, rdb, k, shard.Index(task.ID, m), string(task.ID))
		wantProps := ""
		if n%2 == 0 {
			wantProps = fmt.Sprintf(`{"correlation_id":"%d"}`, n)
		}
		if got.score != task.Due.UnixMilli() || got.body != string(task.Body) || got.props != wantProps || got.hasP != (n%2 == 0) {
			t.Fatalf("%s: %+v", task.ID, got)
		}
	}
	if n := pendingCount(t, rdb, k.Prefix, "orders", m); n != count {
		t.Fatalf("%d pending, want %d", n, count)
	}
	if err := p.ScheduleIDs(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

func TestCancelAndRescheduleID(t *testing.T) {
	ctx := context.Background()
	const m = 4
	rdb, _, p := setup(t, m)
	p.SetWakeWithin(0)
	k := p.Keys()
	id := []byte("order-7:reminder")
	i := shard.Index(id, m)
	due := time.UnixMilli(1767225600000)
	props := &shard.Properties{Type: "reminder"}
	if err := p.ScheduleID(ctx, shard.IDTask{ID: id, Body: []byte("remind"), Props: props, Due: due}); err != nil {
		t.Fatal(err)
	}

	later := due.Add(time.Minute)
	moved, err := p.RescheduleID(ctx, id, later)
	if err != nil || !moved {
		t.Fatalf("RescheduleID = %v, %v; want moved", moved, err)
	}
	if got := stateOf(t, rdb, k, i, string(id)); got.score != later.UnixMilli() || got.body != "remind" || got.props != `{"type":"reminder"}` {
		t.Fatalf("after RescheduleID: %+v (body and properties must stay)", got)
	}
	// The same time again: pending, not moved, no error.
	if moved, err := p.RescheduleID(ctx, id, later); err != nil || moved {
		t.Fatalf("RescheduleID to its own due time = %v, %v; want not moved, no error", moved, err)
	}
	if _, err := p.RescheduleID(ctx, []byte("never"), later); !errors.Is(err, shard.ErrNotPending) {
		t.Fatalf("RescheduleID of an id never scheduled = %v; want ErrNotPending", err)
	}
	if err := rdb.ZScore(ctx, k.Pending(shard.Index([]byte("never"), m)), "never").Err(); !errors.Is(err, redis.Nil) {
		t.Fatal("RescheduleID of an id not pending scheduled it")
	}

	ok, err := p.CancelID(ctx, id)
	if err != nil || !ok {
		t.Fatalf("CancelID = %v, %v; want true", ok, err)
	}
	if got := stateOf(t, rdb, k, i, string(id)); got != (idState{}) {
		t.Fatalf("cancelled, yet shard %d holds %+v", i, got)
	}
	if ok, err := p.CancelID(ctx, id); err != nil || ok {
		t.Fatalf("second CancelID = %v, %v; want false", ok, err)
	}
	if _, err := p.RescheduleID(ctx, id, later); !errors.Is(err, shard.ErrNotPending) {
		t.Fatalf("RescheduleID after CancelID = %v; want ErrNotPending", err)
	}
	for _, f := range []func() error{
		func() error { _, err := p.CancelID(ctx, nil); return err },
		func() error { _, err := p.RescheduleID(ctx, make([]byte, 2000), later); return err },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "must be 1 to 1024 bytes") {
			t.Errorf("a bad id: %v", err)
		}
	}
}

// TestScheduleIDWakes: a task due soon wakes the dispatchers in the same
// pipeline as its MULTI on one server; a reschedule to soon too.
func TestScheduleIDWakes(t *testing.T) {
	ctx := context.Background()
	const m = 16
	rdb, _, p := setup(t, m)
	sub := rdb.Subscribe(ctx, p.Keys().Wake())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	rdb.AddHook(rec)
	id := []byte("order-42:timeout")
	due := time.Now().Add(100 * time.Millisecond)
	if err := p.ScheduleID(ctx, shard.IDTask{ID: id, Body: []byte("b"), Due: due}); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 1 || got[0] != "zadd publish" {
		t.Errorf("ScheduleID of a task due soon sent %q, want one pipeline \"zadd publish\"", got)
	}
	want := shard.WakeDue(shard.Index(id, m), shard.DueMs(due))
	if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != want {
		t.Fatalf("wake-up = %v, %v; want %s", msg, err, want)
	}
	soon := due.Add(50 * time.Millisecond)
	if moved, err := p.RescheduleID(ctx, id, soon); err != nil || !moved {
		t.Fatal(moved, err)
	}
	want = shard.WakeDue(shard.Index(id, m), shard.DueMs(soon))
	if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != want {
		t.Fatalf("wake-up of the reschedule = %v, %v; want %s", msg, err, want)
	}
	rec.take()
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte("later"), Body: []byte("b"), Due: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 1 || got[0] != "zadd" {
		t.Errorf("ScheduleID of a task due in an hour sent %q, want one \"zadd\"", got)
	}
}

// TestIDTasksDuringReshard: while the shard count changes from 4 to 8,
// a schedule by id goes to the id's shard by 8 and takes the copy by 4
// away (member, body, properties), unlisting the id from the moving hash
// in its MULTI; a reschedule finds the id where it is pending, by either
// count, and moves it there (its body and properties are there too); a
// cancel removes it from both.
func TestIDTasksDuringReshard(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	prefix := testPrefix(t, rdb)
	p, err := shard.NewProducer(rdb, prefix, "q", 4)
	if err != nil {
		t.Fatal(err)
	}
	p.SetWakeWithin(0)
	k := p.Keys()
	rdb.Set(ctx, k.ShardCount(), 8, 0)
	rdb.HSet(ctx, k.Reshard(), "from", 4, "to", 8)

	// Ids whose shard differs by 4 and by 8.
	var ids []string
	for n := 0; len(ids) < 3; n++ {
		id := fmt.Sprintf("order-%d:timeout", n)
		if shard.Index([]byte(id), 4) != shard.Index([]byte(id), 8) {
			ids = append(ids, id)
		}
	}
	due := time.UnixMilli(1767225600000)
	// As a producer still on 4 shards wrote them.
	for _, id := range ids {
		j := shard.Index([]byte(id), 4)
		rdb.HSet(ctx, k.Tasks(j), id, "old body")
		rdb.HSet(ctx, k.Props(j), id, `{"type":"old"}`)
		rdb.ZAdd(ctx, k.Pending(j), redis.Z{Score: float64(due.UnixMilli()), Member: id})
	}

	// Schedule by id: in the new shard only, unlisted from its moving hash.
	a := ids[0]
	ai, aj := shard.Index([]byte(a), 8), shard.Index([]byte(a), 4)
	rdb.HSet(ctx, k.Moving(ai), a, due.UnixMilli())
	later := due.Add(time.Hour)
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte(a), Body: []byte("new body"), Props: &shard.Properties{Type: "new"}, Due: later}); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, rdb, k, ai, a); got.score != later.UnixMilli() || got.body != "new body" || got.props != `{"type":"new"}` {
		t.Fatalf("scheduled during the change: the new shard %d holds %+v", ai, got)
	}
	if got := stateOf(t, rdb, k, aj, a); got != (idState{}) {
		t.Fatalf("scheduled during the change: the old shard %d still holds %+v", aj, got)
	}
	if rdb.HExists(ctx, k.Moving(ai), a).Val() {
		t.Fatal("the schedule left the id listed in the moving hash: a move could undo it")
	}

	// Reschedule by id of a task pending by the old count: moved there,
	// with its body and properties, nothing written to the new shard.
	b := ids[1]
	bi, bj := shard.Index([]byte(b), 8), shard.Index([]byte(b), 4)
	if moved, err := p.RescheduleID(ctx, []byte(b), later); err != nil || !moved {
		t.Fatalf("RescheduleID of a task in its old shard = %v, %v", moved, err)
	}
	if got := stateOf(t, rdb, k, bj, b); got.score != later.UnixMilli() || got.body != "old body" || got.props != `{"type":"old"}` {
		t.Fatalf("rescheduled in its old shard %d: %+v", bj, got)
	}
	if got := stateOf(t, rdb, k, bi, b); got != (idState{}) {
		t.Fatalf("the reschedule wrote to the new shard %d: %+v", bi, got)
	}

	// Cancel by id: from both shards, fields and all.
	c := ids[2]
	ci, cj := shard.Index([]byte(c), 8), shard.Index([]byte(c), 4)
	rdb.HSet(ctx, k.Tasks(ci), c, "a copy a move made")
	rdb.ZAdd(ctx, k.Pending(ci), redis.Z{Score: float64(due.UnixMilli()), Member: c})
	if ok, err := p.CancelID(ctx, []byte(c)); err != nil || !ok {
		t.Fatalf("CancelID during the change = %v, %v", ok, err)
	}
	for _, i := range []int{ci, cj} {
		if got := stateOf(t, rdb, k, i, c); got != (idState{}) {
			t.Fatalf("cancelled, yet shard %d holds %+v", i, got)
		}
	}

	// ScheduleIDs too.
	tasks := []shard.IDTask{{ID: []byte(b), Body: []byte("many"), Due: due}, {ID: []byte(c), Body: []byte("many"), Due: due}}
	if err := p.ScheduleIDs(ctx, tasks); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{b, c} {
		if got := stateOf(t, rdb, k, shard.Index([]byte(id), 8), id); got.body != "many" || got.score != due.UnixMilli() || got.hasP {
			t.Fatalf("ScheduleIDs during the change: %s in its new shard: %+v", id, got)
		}
		if got := stateOf(t, rdb, k, shard.Index([]byte(id), 4), id); got != (idState{}) {
			t.Fatalf("ScheduleIDs during the change: %s left in its old shard: %+v", id, got)
		}
	}

	// A slow write by a stale layout (4 shards, no change) is written
	// again by the layout read anew, and the copy by 4 removed.
	shard.UseLayout(p, shard.Layout{Shards: 4}, 4*time.Second)
	if err := p.ScheduleID(ctx, shard.IDTask{ID: []byte(a), Body: []byte("slow"), Due: due}); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, rdb, k, ai, a); got.body != "slow" || got.score != due.UnixMilli() {
		t.Fatalf("a slow write by a stale layout: the new shard %d holds %+v", ai, got)
	}
	if got := stateOf(t, rdb, k, aj, a); got != (idState{}) {
		t.Fatalf("a slow write by a stale layout: the old shard %d holds %+v", aj, got)
	}
}
