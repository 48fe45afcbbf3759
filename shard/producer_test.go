package shard_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// pendingKey computes the contract's key P:{Q:i}, i = XXH64(member) mod m,
// without the package under test.
func pendingKey(prefix, queue string, member []byte, m int) string {
	i := xxhash.Sum64(member) % uint64(m)
	return prefix + ":{" + queue + ":" + strconv.FormatUint(i, 10) + "}"
}

// setup returns a client, a unique prefix cleaned after the test, and a
// producer of queue "orders" with m shards.
func setup(t *testing.T, m int) (*redis.Client, string, *shard.Producer) {
	t.Helper()
	rdb := testRedis(t)
	prefix := testPrefix(t, rdb)
	p, err := shard.NewProducer(rdb, prefix, "orders", m)
	if err != nil {
		t.Fatalf("NewProducer: %v", err)
	}
	return rdb, prefix, p
}

// pendingCount is the number of members in all m pending shards.
func pendingCount(t *testing.T, rdb *redis.Client, prefix, queue string, m int) int64 {
	t.Helper()
	ctx := context.Background()
	var n int64
	for i := 0; i < m; i++ {
		c, err := rdb.ZCard(ctx, fmt.Sprintf("%s:{%s:%d}", prefix, queue, i)).Result()
		if err != nil {
			t.Fatal(err)
		}
		n += c
	}
	return n
}

func TestSchedule(t *testing.T) {
	ctx := context.Background()
	const m = 16
	rdb, prefix, p := setup(t, m)
	due := time.UnixMilli(1767225600000)
	members := [][]byte{
		[]byte("order:42"),
		[]byte(`{"id":1}`),
		[]byte("задача"),
		{0xff, 0x00, 0x80, '\n', 0xfe}, // opaque bytes, not UTF-8
	}
	for i, member := range members {
		d := due.Add(time.Duration(i) * time.Second)
		if err := p.Schedule(ctx, member, d); err != nil {
			t.Fatalf("Schedule(%q): %v", member, err)
		}
		key := pendingKey(prefix, "orders", member, m)
		score, err := rdb.ZScore(ctx, key, string(member)).Result()
		if err != nil {
			t.Fatalf("member %q not in %s: %v", member, key, err)
		}
		if int64(score) != d.UnixMilli() || score != float64(d.UnixMilli()) {
			t.Errorf("score of %q = %v, want %d", member, score, d.UnixMilli())
		}
	}
	if key := pendingKey(prefix, "orders", []byte("order:42"), m); key != prefix+":{orders:4}" {
		t.Fatalf("test helper disagrees with the contract: %s", key)
	}
	if n := pendingCount(t, rdb, prefix, "orders", m); n != int64(len(members)) {
		t.Errorf("%d members pending over all shards, want %d", n, len(members))
	}
	// The member comes back byte for byte.
	got, err := rdb.ZRange(ctx, pendingKey(prefix, "orders", members[3], m), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range got {
		found = found || g == string(members[3])
	}
	if !found {
		t.Errorf("binary member not returned unchanged: %q", got)
	}

	// Sub-millisecond parts are dropped, not rounded up.
	member := []byte("order:43")
	if err := p.Schedule(ctx, member, time.UnixMilli(1767225600123).Add(999*time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	if s, err := rdb.ZScore(ctx, pendingKey(prefix, "orders", member, m), "order:43").Result(); err != nil || s != 1767225600123 {
		t.Errorf("score = %v, %v; want 1767225600123", s, err)
	}

	// Scheduling again moves the task; it stays one pending task.
	later := due.Add(time.Hour)
	if err := p.Schedule(ctx, []byte("order:42"), later); err != nil {
		t.Fatal(err)
	}
	if s, _ := rdb.ZScore(ctx, prefix+":{orders:4}", "order:42").Result(); s != float64(later.UnixMilli()) {
		t.Errorf("score after second Schedule = %v, want %d", s, later.UnixMilli())
	}
	if n := pendingCount(t, rdb, prefix, "orders", m); n != int64(len(members))+1 {
		t.Errorf("%d members pending, want %d", n, len(members)+1)
	}
}

func TestScheduleMany(t *testing.T) {
	ctx := context.Background()
	const m, count = 8, 1000
	rdb, prefix, p := setup(t, m)
	base := time.UnixMilli(1767225600000)
	tasks := make([]shard.Task, count)
	want := map[string]int64{}
	for i := range tasks {
		member := fmt.Sprintf("task:%d", i)
		tasks[i] = shard.Task{Member: []byte(member), Due: base.Add(time.Duration(i) * time.Millisecond)}
		want[member] = base.UnixMilli() + int64(i)
	}
	if err := p.ScheduleMany(ctx, tasks); err != nil {
		t.Fatalf("ScheduleMany: %v", err)
	}
	total := 0
	for i := 0; i < m; i++ {
		key := fmt.Sprintf("%s:{orders:%d}", prefix, i)
		zs, err := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(zs) == 0 {
			t.Errorf("shard %d is empty; 1000 tasks should reach all %d shards", i, m)
		}
		for _, z := range zs {
			member := z.Member.(string)
			if k := pendingKey(prefix, "orders", []byte(member), m); k != key {
				t.Errorf("%s is in %s, want %s", member, key, k)
			}
			if int64(z.Score) != want[member] {
				t.Errorf("%s has score %v, want %d", member, z.Score, want[member])
			}
			delete(want, member)
			total++
		}
	}
	if total != count || len(want) != 0 {
		t.Errorf("found %d tasks, %d missing, want %d", total, len(want), count)
	}
	if err := p.ScheduleMany(ctx, nil); err != nil {
		t.Errorf("ScheduleMany(nil) = %v", err)
	}
}

func TestReschedule(t *testing.T) {
	ctx := context.Background()
	const m = 16
	rdb, prefix, p := setup(t, m)
	member := []byte("order:42")
	key := pendingKey(prefix, "orders", member, m)
	if err := p.Schedule(ctx, member, time.UnixMilli(1767225600000)); err != nil {
		t.Fatal(err)
	}
	if err := p.Reschedule(ctx, member, time.UnixMilli(1767229200000)); err != nil {
		t.Fatalf("Reschedule: %v", err)
	}
	if s, err := rdb.ZScore(ctx, key, string(member)).Result(); err != nil || s != 1767229200000 {
		t.Errorf("score after Reschedule = %v, %v; want 1767229200000", s, err)
	}
	if n := pendingCount(t, rdb, prefix, "orders", m); n != 1 {
		t.Errorf("%d pending after Reschedule, want 1", n)
	}

	other := []byte("order:never")
	err := p.Reschedule(ctx, other, time.UnixMilli(1767225600000))
	if !errors.Is(err, shard.ErrNotPending) {
		t.Errorf("Reschedule of a member never scheduled = %v, want ErrNotPending", err)
	}
	if _, err := rdb.ZScore(ctx, pendingKey(prefix, "orders", other, m), string(other)).Result(); err != redis.Nil {
		t.Errorf("Reschedule of a member not pending scheduled it (err %v)", err)
	}

	ok, err := p.Cancel(ctx, member)
	if err != nil || !ok {
		t.Fatalf("Cancel = %v, %v; want true", ok, err)
	}
	if err := p.Reschedule(ctx, member, time.UnixMilli(1767225600000)); !errors.Is(err, shard.ErrNotPending) {
		t.Errorf("Reschedule after Cancel = %v, want ErrNotPending", err)
	}
	if n := pendingCount(t, rdb, prefix, "orders", m); n != 0 {
		t.Errorf("%d pending after Reschedule of a cancelled task, want 0", n)
	}
}

func TestCancel(t *testing.T) {
	ctx := context.Background()
	const m = 4
	rdb, prefix, p := setup(t, m)
	member := []byte(`{"id":1}`)
	if err := p.Schedule(ctx, member, time.UnixMilli(1767225600000)); err != nil {
		t.Fatal(err)
	}
	if err := p.Schedule(ctx, []byte("keep"), time.UnixMilli(1767225600000)); err != nil {
		t.Fatal(err)
	}
	ok, err := p.Cancel(ctx, member)
	if err != nil || !ok {
		t.Errorf("first Cancel = %v, %v; want true, nil", ok, err)
	}
	ok, err = p.Cancel(ctx, member)
	if err != nil || ok {
		t.Errorf("second Cancel = %v, %v; want false, nil", ok, err)
	}
	if _, err := rdb.ZScore(ctx, pendingKey(prefix, "orders", member, m), string(member)).Result(); err != redis.Nil {
		t.Errorf("cancelled member still pending (err %v)", err)
	}
	if n := pendingCount(t, rdb, prefix, "orders", m); n != 1 {
		t.Errorf("%d pending, want 1 (the other task)", n)
	}
}

func TestNewProducer(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { rdb.Close() })
	bad := []struct {
		queue string
		m     int
	}{
		{"", 16},
		{"or ders", 16},
		{"a:b", 16},
		{"{orders}", 16},
		{strings.Repeat("q", 65), 16},
		{"задача", 16},
		{"orders", 0},
		{"orders", -1},
		{"orders", shard.MaxShards + 1},
	}
	for _, b := range bad {
		if p, err := shard.NewProducer(rdb, "dq", b.queue, b.m); err == nil || p != nil {
			t.Errorf("NewProducer(%q, %d) = %v, %v; want an error", b.queue, b.m, p, err)
		}
	}
	good := []struct {
		queue string
		m     int
	}{
		{"orders", 1},
		{"mail.out-2", shard.MaxShards},
		{strings.Repeat("q", 64), 16},
	}
	for _, g := range good {
		p, err := shard.NewProducer(rdb, "dq", g.queue, g.m)
		if err != nil {
			t.Errorf("NewProducer(%q, %d): %v", g.queue, g.m, err)
			continue
		}
		if k := p.Keys(); k.Prefix != "dq" || k.Queue != g.queue {
			t.Errorf("Keys() = %+v", k)
		}
	}
	p, err := shard.NewProducer(rdb, "", "orders", 16)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Keys().Prefix; got != "dq" {
		t.Errorf("empty prefix gives %q, want the default dq", got)
	}
}

func TestEnsureShardCount(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	prefix := testPrefix(t, rdb)
	keys := shard.Keys{Prefix: prefix, Queue: "orders"}

	if err := shard.EnsureShardCount(ctx, rdb, keys, 16); err != nil {
		t.Fatalf("first EnsureShardCount: %v", err)
	}
	if got, err := rdb.Get(ctx, keys.ShardCount()).Result(); err != nil || got != "16" {
		t.Errorf("recorded shard count = %q, %v; want 16", got, err)
	}
	if err := shard.EnsureShardCount(ctx, rdb, keys, 16); err != nil {
		t.Errorf("same count again: %v", err)
	}
	err := shard.EnsureShardCount(ctx, rdb, keys, 8)
	var sce *shard.ShardCountError
	if !errors.As(err, &sce) {
		t.Fatalf("different count: %v (%T), want *shard.ShardCountError", err, err)
	}
	if sce.Queue != "orders" || sce.Recorded != 16 || sce.Configured != 8 {
		t.Errorf("ShardCountError = %+v, want queue orders, recorded 16, configured 8", sce)
	}
	if text := err.Error(); !strings.Contains(text, "16") || !strings.Contains(text, "8") || !strings.Contains(text, "orders") {
		t.Errorf("error %q does not name the queue and both counts", text)
	}
	if got, _ := rdb.Get(ctx, keys.ShardCount()).Result(); got != "16" {
		t.Errorf("a mismatch overwrote the recorded count: %q", got)
	}

	// Another queue under the same prefix has its own record.
	if err := shard.EnsureShardCount(ctx, rdb, shard.Keys{Prefix: prefix, Queue: "mail"}, 8); err != nil {
		t.Errorf("other queue: %v", err)
	}

	// A record that is not a number is an error, not a silent pass.
	junk := shard.Keys{Prefix: prefix, Queue: "junk"}
	if err := rdb.Set(ctx, junk.ShardCount(), "lots", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := shard.EnsureShardCount(ctx, rdb, junk, 8); err == nil {
		t.Error("non-numeric record accepted")
	}
}

// recorder records the ZADDs and PUBLISHes a client sends: one line per
// command or pipeline, the names of its commands.
type recorder struct {
	mu    sync.Mutex
	sends []string
}

func (r *recorder) add(cmds []redis.Cmder) {
	var names []string
	for _, c := range cmds {
		if n := c.Name(); n == "zadd" || n == "publish" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return
	}
	r.mu.Lock()
	r.sends = append(r.sends, strings.Join(names, " "))
	r.mu.Unlock()
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sends
	r.sends = nil
	return s
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.add(cmds)
		return next(ctx, cmds)
	}
}

// TestWakeRidesTheZAddPipeline: on a single server a pipeline runs in
// order on one connection, so the wake-up of a task due soon follows its
// ZADD in the same round trip (on Redis Cluster it waits for the ZADD's
// reply: TestWakeAfterZAddOnCluster). A task due later sends no wake-up.
func TestWakeRidesTheZAddPipeline(t *testing.T) {
	ctx := context.Background()
	const m = 16
	rdb, prefix, p := setup(t, m)
	sub := rdb.Subscribe(ctx, p.Keys().Wake())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	rdb.AddHook(rec)

	member := []byte("order:42")
	due := time.Now().Add(100 * time.Millisecond)
	if err := p.Schedule(ctx, member, due); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 1 || got[0] != "zadd publish" {
		t.Errorf("Schedule of a task due soon sent %q, want one pipeline \"zadd publish\"", got)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Payload != shard.WakeDue(4, shard.DueMs(due)) {
		t.Fatalf("wake-up = %v, %v; want %s", msg, err, shard.WakeDue(4, shard.DueMs(due)))
	}
	if err := rdb.ZScore(ctx, pendingKey(prefix, "orders", member, m), string(member)).Err(); err != nil {
		t.Errorf("woken, but %s is not pending: %v", member, err)
	}

	if err := p.Schedule(ctx, []byte("later"), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); len(got) != 1 || got[0] != "zadd" {
		t.Errorf("Schedule of a task due in an hour sent %q, want one \"zadd\"", got)
	}

	// Shards 11 and 9 (the contract's test vectors).
	tasks := []shard.Task{{Member: []byte("a"), Due: due}, {Member: []byte(""), Due: due}}
	if err := p.ScheduleMany(ctx, tasks); err != nil {
		t.Fatal(err)
	}
	got := rec.take()
	if len(got) != 1 || strings.Count(got[0], "zadd") != 2 || strings.Count(got[0], "publish") != 2 {
		t.Errorf("ScheduleMany of 2 shards due soon sent %q, want one pipeline of 2 zadd and 2 publish", got)
	}
}

// TestCancelRemovesProperties: a plain member with properties (as a
// recurring schedule's occurrences have) cancelled by its body leaves no
// properties behind, which a later plain task with the same body, scheduled
// without any, would otherwise go out with.
func TestCancelRemovesProperties(t *testing.T) {
	ctx := context.Background()
	const m = 4
	rdb, prefix, p := setup(t, m)
	member := []byte("report")
	key := pendingKey(prefix, "orders", member, m)
	props := key + ":props"
	rdb.HSet(ctx, props, string(member), `{"routing_key":"cron","headers":{"src":"cron"}}`)
	if err := p.Schedule(ctx, member, time.UnixMilli(1767225600000)); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.Cancel(ctx, member); err != nil || !ok {
		t.Fatalf("Cancel = %v, %v; want true, nil", ok, err)
	}
	if n := rdb.HLen(ctx, props).Val(); n != 0 {
		t.Fatalf("%d properties left in %s after the cancel: a later task with this body would carry them", n, props)
	}
}
