package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// runCLI runs the dispatcher binary with args and the harness's settings,
// and returns its exit code and output.
func (h *harness) runCLI(timeout time.Duration, args ...string) (int, string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = childEnv(h.env())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		h.t.Fatalf("dispatcher %v: %v", args, err)
	}
	return code, out.String()
}

// hourTasks schedules n tasks due in an hour with a producer fixed to m
// shards, and returns their members.
func hourTasks(t *testing.T, h *harness, queue string, m, n int) [][]byte {
	t.Helper()
	p, err := shard.NewProducer(h.rdb, h.prefix, queue, m)
	if err != nil {
		t.Fatal(err)
	}
	var members [][]byte
	var tasks []shard.Task
	due := time.Now().Add(time.Hour)
	for i := 0; i < n; i++ {
		mem := []byte(fmt.Sprintf("hour-%d", i))
		members = append(members, mem)
		tasks = append(tasks, shard.Task{Member: mem, Due: due})
	}
	for i := 0; i < len(tasks); i += 1000 {
		if err := p.ScheduleMany(context.Background(), tasks[i:min(i+1000, len(tasks))]); err != nil {
			t.Fatal(err)
		}
	}
	return members
}

// checkPlaced fails unless every member is pending exactly once, in its
// shard by m, across shards 0..span-1.
func checkPlaced(t *testing.T, h *harness, queue string, members [][]byte, m, span int) {
	t.Helper()
	ctx := context.Background()
	k := shard.Keys{Prefix: h.prefix, Queue: queue}
	where := map[string][]int{}
	for i := 0; i < span; i++ {
		for _, mem := range h.rdb.ZRange(ctx, k.Pending(i), 0, -1).Val() {
			if strings.HasPrefix(mem, "hour-") {
				where[mem] = append(where[mem], i)
			}
		}
	}
	bad := 0
	for _, mem := range members {
		got := where[string(mem)]
		if len(got) != 1 || got[0] != shard.Index(mem, m) {
			if bad < 5 {
				t.Errorf("%s pending in shards %v, want only %d (of %d)", mem, got, shard.Index(mem, m), m)
			}
			bad++
		}
	}
	if bad > 0 || len(where) != len(members) {
		t.Fatalf("%d of %d hour-away tasks misplaced; %d distinct pending", bad, len(members), len(where))
	}
}

// TestReshardGrowUnderLoad: 16 -> 64 shards while two instances dispatch
// 2,000 tasks/s from a Python producer (examples/python/producer.py) that
// hashes with 16 for its first half and then follows the count in Redis;
// 10,000 tasks due in an hour must end in their shard by 64; one instance
// is SIGKILLed during the change. Nothing is missing or early.
func TestReshardGrowUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 60 s")
	}
	q := queueSpec{Name: "grow", Shards: 16}
	h := newHarness(t, q)
	a, b := h.start(), h.start()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	eventually(t, 10*time.Second, "shard count recorded", func() bool {
		return h.rdb.Get(context.Background(), k.ShardCount()).Val() == "16"
	})
	hour := hourTasks(t, h, q.Name, 16, 10_000)

	load := exec.Command("/usr/bin/python3", "testdata/reshard_load.py", "--redis", testenv.RedisURL(t),
		"--prefix", h.prefix, "--queue", q.Name, "--shards", "16", "--rate", "2000", "--seconds", "20", "--spread", "30")
	var loadErr bytes.Buffer
	load.Stderr = &loadErr
	stdout, err := load.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			id, due, _ := strings.Cut(sc.Text(), " ")
			ms, _ := strconv.ParseInt(due, 10, 64)
			want[id] = ms
		}
	}()

	time.Sleep(5 * time.Second)
	began := time.Now()
	code, out := h.runCLI(2*time.Minute, "reshard", "--queue", q.Name, "--shards", "64")
	if code != 0 {
		t.Fatalf("reshard: exit %d:\n%s", code, out)
	}
	t.Logf("reshard 16 -> 64 took %s:\n%s", time.Since(began).Round(time.Millisecond), out)
	// Every instance notices at once (the "layout" wake-up).
	noticed := time.Now()
	eventually(t, 6*time.Second, "both instances serving the new layout", func() bool {
		return strings.Contains(a.out.String(), "shard layout changed") && strings.Contains(b.out.String(), "shard layout changed")
	})
	t.Logf("both instances noticed within %s", time.Since(noticed).Round(time.Millisecond))
	a.signal(syscall.SIGKILL) // in the middle of the change
	a.wait(10 * time.Second)
	h.start()

	<-read
	if err := load.Wait(); err != nil {
		t.Fatalf("load: %v\n%s", err, loadErr.String())
	}
	t.Logf("load: %d tasks; %s", len(want), strings.TrimSpace(loadErr.String()))
	if !strings.Contains(loadErr.String(), "switched True layout (64, 16)") {
		t.Fatalf("the Python producer did not switch to 64 shards: %s", loadErr.String())
	}
	o := h.verify(q.Name, want, 60*time.Second, len(want)/100)
	p50, p99 := latenessPercentiles(h, q.Name, want)
	t.Logf("RESHARD grow 16->64 under 2000/s: scheduled=%d missing=%d early=%d duplicates=%d late_p50_ms=%d late_p99_ms=%d worst_late_ms=%d (the SIGKILLed instance's tasks wait out their lease)",
		o.Scheduled, o.Missing, o.Early, o.Duplicates, p50.Milliseconds(), p99.Milliseconds(), o.WorstLate.Milliseconds())

	code, out = h.runCLI(2*time.Minute, "reshard", "finish", "--queue", q.Name)
	if code != 0 {
		t.Fatalf("reshard finish: exit %d:\n%s", code, out)
	}
	checkPlaced(t, h, q.Name, hour, 64, 64)
	l, err := shard.ReadLayout(context.Background(), h.rdb, k)
	if err != nil || l != (shard.Layout{Shards: 64}) {
		t.Fatalf("layout after finish: %+v, %v", l, err)
	}
}

// TestReshardShrinkBacklog: 64 -> 16 with 100,000 tasks due now and 2,000
// due in an hour; finish waits for the 48 retired shards to empty. Then a
// producer still on 64 writes to a retired shard: the sweeping instance
// moves those tasks, and they are dispatched.
func TestReshardShrinkBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 100,000 tasks")
	}
	q := queueSpec{Name: "shrink", Shards: 64}
	h := newHarness(t, q)
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	if err := h.rdb.Set(context.Background(), k.ShardCount(), 64, 0).Err(); err != nil {
		t.Fatal(err)
	}
	hour := hourTasks(t, h, q.Name, 64, 2_000)
	want := scheduleSpread(t, h.producer(q.Name), "backlog", 100_000, time.Now(), time.Millisecond)
	h.start()
	h.start()
	began := time.Now()
	code, out := h.runCLI(2*time.Minute, "reshard", "--queue", q.Name, "--shards", "16")
	if code != 0 {
		t.Fatalf("reshard: exit %d:\n%s", code, out)
	}
	t.Logf("reshard 64 -> 16 took %s:\n%s", time.Since(began).Round(time.Millisecond), out)
	code, out = h.runCLI(3*time.Minute, "reshard", "finish", "--queue", q.Name)
	if code != 0 {
		t.Fatalf("reshard finish: exit %d:\n%s", code, out)
	}
	t.Logf("reshard 64 -> 16 with finish took %s:\n%s", time.Since(began).Round(time.Millisecond), out)
	o := h.verify(q.Name, want, 60*time.Second, 0)
	t.Logf("RESHARD shrink 64->16, 100k due now: missing=%d duplicates=%d worst_late_ms=%d", o.Missing, o.Duplicates, o.WorstLate.Milliseconds())
	checkPlaced(t, h, q.Name, hour, 16, 64)

	// A producer that never switched writes to retired shards.
	old, err := shard.NewProducer(h.rdb, h.prefix, q.Name, 64)
	if err != nil {
		t.Fatal(err)
	}
	late := map[string]int64{}
	ctx := context.Background()
	due := time.Now().Add(2 * time.Second)
	for i := 0; len(late) < 50; i++ {
		m := []byte(fmt.Sprintf("late-%d", i))
		j := shard.Index(m, 64)
		if j < 16 {
			continue
		}
		if err := h.rdb.ZAdd(ctx, k.Pending(j), redisZ(due, m)).Err(); err != nil {
			t.Fatal(err)
		}
		late[shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
	}
	_ = old
	h.verify(q.Name, late, 30*time.Second, 0)
}

// TestReshardRetiredInflight: after a shrink from 4 to 2 shards has
// finished, retired shards still hold tasks in flight whose lease ran out:
// an instance claimed them there in the moment before it applied the
// finish and was killed before confirming them (one of them after a
// failed publish, with its attempt counted). No dispatcher serves those
// shards any more; the sweeping instance hands the tasks to their shards
// by 2, and they are delivered.
func TestReshardRetiredInflight(t *testing.T) {
	q := queueSpec{Name: "retiredinflight", Shards: 2}
	h := newHarness(t, q)
	ctx := context.Background()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	if err := h.rdb.Set(ctx, k.ShardCount(), 4, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reshard.Reshard(ctx, h.rdb, k, 2, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reshard.Close(ctx, h.rdb, k, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	if l, err := shard.ReadLayout(ctx, h.rdb, k); err != nil || l != (shard.Layout{Shards: 2, Retired: 4}) {
		t.Fatalf("layout after the shrink: %+v, %v", l, err)
	}
	want := map[string]int64{}
	due := time.Now().Add(-2 * time.Second).UnixMilli()
	lease := float64(time.Now().Add(-time.Second).UnixMilli()) // ran out
	for n := 0; len(want) < 2; n++ {
		m := fmt.Sprintf("held-%d", n)
		i := shard.Index([]byte(m), 4)
		if i < 2 {
			continue
		}
		e := fmt.Sprintf("%d:%s", due, m)
		pipe := h.rdb.TxPipeline()
		pipe.ZAdd(ctx, k.Inflight(i), redis.Z{Score: lease, Member: e})
		if len(want) == 1 { // a publish failed once; its backoff ran out
			pipe.HSet(ctx, k.Attempts(i), e, 1)
			pipe.ZAdd(ctx, k.Retrying(i), redis.Z{Score: float64(due), Member: e})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		want[shard.MessageID([]byte(m), due)] = due
	}
	h.start()
	h.verify(q.Name, want, 30*time.Second, 0)
	eventually(t, 10*time.Second, "nothing left in flight", func() bool {
		for i := range 4 {
			if h.rdb.Exists(ctx, k.Inflight(i), k.Attempts(i), k.Retrying(i)).Val() > 0 {
				return false
			}
		}
		return true
	})
}

// TestReshardKillAndResume: the reshard command SIGKILLed in the middle of
// a move, then run again: it waits out the dead mover's lock, resumes,
// and every task ends in its shard exactly once.
func TestReshardKillAndResume(t *testing.T) {
	q := queueSpec{Name: "resume", Shards: 8}
	h := newHarness(t, q)
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	if err := h.rdb.Set(context.Background(), k.ShardCount(), 8, 0).Err(); err != nil {
		t.Fatal(err)
	}
	hour := hourTasks(t, h, q.Name, 8, 100_000)
	cmd := exec.Command(binary, "reshard", "--queue", q.Name, "--shards", "32")
	cmd.Env = childEnv(h.env())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once it has moved some, not all.
	eventually(t, 30*time.Second, "the first moves", func() bool {
		return h.rdb.ZCard(context.Background(), k.Pending(31)).Val() > 0
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	moved := int64(0)
	for i := 8; i < 32; i++ {
		moved += h.rdb.ZCard(context.Background(), k.Pending(i)).Val()
	}
	t.Logf("killed after moving %d of about %d", moved, 100_000*3/4)
	if moved >= 100_000*3/4 {
		t.Fatalf("the move finished before the kill (%d moved): nothing to resume", moved)
	}
	began := time.Now()
	code, again := h.runCLI(2*time.Minute, "reshard", "--queue", q.Name, "--shards", "32")
	if code != 0 {
		t.Fatalf("reshard again: exit %d:\n%s", code, again)
	}
	t.Logf("resumed in %s:\n%s", time.Since(began).Round(time.Millisecond), again)
	if !strings.Contains(again, "another mover") {
		t.Errorf("the second run did not wait for the dead mover's lock:\n%s", again)
	}
	checkPlaced(t, h, q.Name, hour, 32, 32)
	// A second change while this one is open is refused.
	code, busy := h.runCLI(time.Minute, "reshard", "--queue", q.Name, "--shards", "4")
	if code == 0 || !strings.Contains(busy, "another change of the shard count is in progress (from 8 to 32 shards)") {
		t.Fatalf("second change: exit %d:\n%s", code, busy)
	}
}

// TestReshardCancelAndReschedule: during a change, the Go producer (which
// follows the layout) cancels and reschedules tasks written with the old
// count, moved or not; a producer on the old count that follows the
// contract's rule (ZREM by both counts) cancels too.
func TestReshardCancelAndReschedule(t *testing.T) {
	q := queueSpec{Name: "steer", Shards: 4}
	h := newHarness(t, q)
	h.start()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	ctx := context.Background()
	eventually(t, 10*time.Second, "shard count recorded", func() bool { return h.rdb.Get(ctx, k.ShardCount()).Val() == "4" })
	old, err := shard.NewProducer(h.rdb, h.prefix, q.Name, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Members that change shard between 4 and 8.
	var ms [][]byte
	for i := 0; len(ms) < 8; i++ {
		m := []byte(fmt.Sprintf("steer-%d", i))
		if shard.Index(m, 4) != shard.Index(m, 8) {
			ms = append(ms, m)
		}
	}
	far := time.Now().Add(time.Hour)
	for _, m := range ms {
		if err := old.Schedule(ctx, m, far); err != nil {
			t.Fatal(err)
		}
	}
	// ms[0..3] are moved by the reshard; ms[4..7] are scheduled with the
	// old count after it (a producer not yet switched), so not moved.
	code, out := h.runCLI(time.Minute, "reshard", "--queue", q.Name, "--shards", "8")
	if code != 0 {
		t.Fatalf("reshard: exit %d:\n%s", code, out)
	}
	for _, m := range ms[4:] {
		h.rdb.ZRem(ctx, k.Pending(shard.Index(m, 8)), m)
		h.rdb.ZAdd(ctx, k.Pending(shard.Index(m, 4)), redisZ(far, m))
	}
	follow, err := shard.NewProducer(h.rdb, h.prefix, q.Name, 4) // follows Redis: 8, from 4
	if err != nil {
		t.Fatal(err)
	}
	if l := follow.Layout(ctx); l != (shard.Layout{Shards: 8, From: 4}) {
		t.Fatalf("producer's layout %+v, want 8 from 4", l)
	}
	soon := time.Now().Add(2 * time.Second)
	want := map[string]int64{}
	for n, m := range ms {
		switch n % 4 {
		case 0, 1: // cancelled: by the Go producer, and by hand by both counts
			var ok bool
			if n%4 == 0 {
				ok, err = follow.Cancel(ctx, m)
			} else {
				a := h.rdb.ZRem(ctx, k.Pending(shard.Index(m, 4)), m).Val()
				b := h.rdb.ZRem(ctx, k.Pending(shard.Index(m, 8)), m).Val()
				ok = a+b == 1
			}
			if err != nil || !ok {
				t.Fatalf("cancel %s: %v, %v", m, ok, err)
			}
		case 2: // rescheduled with Reschedule
			if err := follow.Reschedule(ctx, m, soon); err != nil {
				t.Fatalf("reschedule %s: %v", m, err)
			}
			want[shard.MessageID(m, soon.UnixMilli())] = soon.UnixMilli()
		case 3: // rescheduled by scheduling again
			if err := follow.Schedule(ctx, m, soon); err != nil {
				t.Fatal(err)
			}
			want[shard.MessageID(m, soon.UnixMilli())] = soon.UnixMilli()
		}
	}
	h.verify(q.Name, want, 20*time.Second, 0)
	for _, m := range ms {
		for i := 0; i < 8; i++ {
			if s, err := h.rdb.ZScore(ctx, k.Pending(i), string(m)).Result(); err == nil {
				t.Errorf("%s still pending in shard %d (due %d) after its cancel or reschedule", m, i, int64(s))
			}
		}
	}
	st, err := reshard.ReadStatus(ctx, h.rdb, k)
	if err != nil || !st.Changing() || st.Progress.Moved < 4 {
		t.Fatalf("status %+v, %v; want a change with at least 4 moved", st, err)
	}
}

func redisZ(due time.Time, m []byte) redis.Z {
	return redis.Z{Score: float64(due.UnixMilli()), Member: m}
}

// latenessPercentiles of the first delivery of each wanted task, from the
// last verify of queue.
func latenessPercentiles(h *harness, queue string, want map[string]int64) (p50, p99 time.Duration) {
	seen := map[string]bool{}
	var late []time.Duration
	for _, r := range h.delivered[queue] {
		due, ok := want[r.d.MessageId]
		if ok && !seen[r.d.MessageId] {
			seen[r.d.MessageId] = true
			late = append(late, r.at.Sub(time.UnixMilli(due)))
		}
	}
	if len(late) == 0 {
		return 0, 0
	}
	slices.Sort(late)
	return late[len(late)/2], late[len(late)*99/100]
}
