package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestReshardCluster changes a queue's shard count from 16 to 64 on a
// Redis Cluster of three primaries while two dispatchers serve it and a
// layout-following Go producer (Schedule and ScheduleMany) schedules about
// 300 tasks/s due within 30 s,
// with 2,000 tasks due in an hour scheduled before the change. The
// primary holding the queue's layout (and the mover's lock and record) is
// failed over (CLUSTER FAILOVER) while `dispatcher reshard` runs; a run
// the failover breaks is run again, and a run after a complete one must
// resume the same change (exit 0, "resumed"). Then `dispatcher reshard
// finish`. Checked: every task due within 30 s delivered, none early (the
// receipt against the message_id's due time and x-due-ms), duplicates
// counted and logged; every task due in an hour pending in its shard by
// 64 only, with its due time; nothing in flight, dead or listed as moving;
// the layout 64 shards, no change in progress.
func TestReshardCluster(t *testing.T) {
	const (
		from, to  = 16, 64
		hourAway  = 2000
		ballast   = 30000 // due in 45 min: a move that lasts through the failover
		produce   = 20 * time.Second
		perTick   = 3 // every 10 ms: 300/s
		dueWithin = 30 * time.Second
	)
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	q := queueSpec{Name: "rs", Shards: from}
	h := newClusterHarness(t, c, q)
	h.extra["DISPATCHER_LEASE"] = "5s"
	keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	ctx := context.Background()

	// Collect every delivery from the start, with its receipt time.
	var mu sync.Mutex
	var got []received
	collectCtx, stopCollect := context.WithCancel(ctx)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			select {
			case <-collectCtx.Done():
				return
			case d := <-h.got[q.Name]:
				mu.Lock()
				got = append(got, received{at: time.Now(), d: d})
				mu.Unlock()
			}
		}
	}()
	defer func() { stopCollect(); <-collected }()

	h.start()
	h.start()
	prod := h.producer(q.Name)
	eventually(t, 20*time.Second, "the dispatchers to record the shard count", func() bool {
		l, err := shard.ReadLayout(ctx, h.rdb, keys)
		return err == nil && l.Shards == from
	})

	// 2,000 tasks due in an hour, and the ballast, written with 16 shards.
	later := time.Now().Add(time.Hour).UnixMilli()
	var far []shard.Task
	for i := range hourAway {
		far = append(far, shard.Task{Member: []byte(fmt.Sprintf("hour-%d", i)), Due: time.UnixMilli(later + int64(i))})
	}
	for i := range ballast {
		far = append(far, shard.Task{Member: []byte(fmt.Sprintf("ballast-%d", i)), Due: time.UnixMilli(later - 15*60*1000 + int64(i))})
	}
	for k := 0; k < len(far); k += 1000 {
		if err := prod.ScheduleMany(ctx, far[k:min(k+1000, len(far))]); err != nil {
			t.Fatal(err)
		}
	}
	waitReplicated(t, h.rdb)

	// The steady producer: it follows the layout (read at most once a
	// second), retrying a schedule that failed during the failover.
	want := map[string]int64{}
	uncertain := map[string]bool{} // a schedule given up on: it may have been written
	var wmu sync.Mutex
	prodCtx, stopProd := context.WithTimeout(ctx, produce)
	defer stopProd()
	var prodErrs int
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		rng := rand.New(rand.NewPCG(1, 2))
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		// Every other tick one ScheduleMany of the tick's tasks, else a
		// Schedule each.
		for n, ticks := 0, 0; prodCtx.Err() == nil; ticks++ {
			<-tick.C
			var tasks []shard.Task
			for range perTick {
				n++
				due := time.Now().Add(time.Duration(rng.Int64N(int64(dueWithin))))
				tasks = append(tasks, shard.Task{Member: []byte(fmt.Sprintf("steady-%d", n)), Due: due})
			}
			batches := [][]shard.Task{tasks}
			if ticks%2 == 0 {
				batches = [][]shard.Task{tasks[:1], tasks[1:2], tasks[2:]}
			}
			for _, b := range batches {
				for {
					var err error
					if len(b) == 1 {
						err = prod.Schedule(ctx, b[0].Member, b[0].Due)
					} else {
						err = prod.ScheduleMany(ctx, b)
					}
					wmu.Lock()
					for _, tk := range b {
						id := shard.MessageID(tk.Member, tk.Due.UnixMilli())
						switch {
						case err == nil:
							want[id] = tk.Due.UnixMilli()
						case prodCtx.Err() != nil:
							uncertain[id] = true
						}
					}
					if err != nil {
						prodErrs++
					}
					wmu.Unlock()
					if err == nil || prodCtx.Err() != nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
	}()

	// The reshard, with the failover of the primary holding the layout
	// (and the mover's lock and record) as soon as the change is recorded,
	// and the run interrupted (SIGTERM) in the middle of its move: running
	// it again must be enough.
	time.Sleep(2 * time.Second)
	victim := c.PrimaryOf(keys.ShardCount())
	type run struct {
		cmd         *exec.Cmd
		out, errOut bytes.Buffer
		code        int
		err         error
		began       time.Time
		took        time.Duration
	}
	startReshard := func(args ...string) *run {
		r := &run{cmd: exec.Command(binary, append([]string{"reshard"}, args...)...), began: time.Now()}
		r.cmd.Env = childEnv(h.env())
		r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.errOut
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	wait := func(r *run) *run {
		done := make(chan error, 1)
		go func() { done <- r.cmd.Wait() }()
		select {
		case r.err = <-done:
		case <-time.After(60 * time.Second):
			_ = r.cmd.Process.Kill()
			r.err = <-done
		}
		var ee *exec.ExitError
		if errors.As(r.err, &ee) {
			r.code, r.err = ee.ExitCode(), nil
		}
		r.took = time.Since(r.began)
		return r
	}
	reshard := func(args ...string) *run { return wait(startReshard(args...)) }
	r := startReshard("--queue", q.Name, "--shards", fmt.Sprint(to), "--json")
	eventually(t, 20*time.Second, "dispatcher reshard to record the change", func() bool {
		return h.rdb.Exists(ctx, keys.Reshard()).Val() == 1
	})
	recorded := time.Now()
	interrupt := time.AfterFunc(200*time.Millisecond, func() { _ = r.cmd.Process.Signal(syscall.SIGTERM) })
	defer interrupt.Stop()
	c.Failover(c.ReplicaOf(victim))
	failedOver := time.Since(recorded)
	wait(r)
	if r.err != nil {
		t.Fatalf("dispatcher reshard: %v", r.err)
	}
	t.Logf("primary %s (the layout, the mover's lock and record) failed over within %s of the change being recorded; "+
		"dispatcher reshard, interrupted at 200 ms, ended at %s: exit %d\n%s%s", victim.Addr, failedOver.Round(time.Millisecond),
		time.Since(recorded).Round(time.Millisecond), r.code, r.out.String(), r.errOut.String())
	if r.code == 0 {
		t.Logf("the first run ended before the interruption: running again after a failure was not exercised")
	}
	for k := 0; r.code != 0; k++ {
		if k == 3 {
			t.Fatalf("dispatcher reshard still fails: exit %d\n%s%s", r.code, r.out.String(), r.errOut.String())
		}
		r = reshard("--queue", q.Name, "--shards", fmt.Sprint(to), "--json")
		t.Logf("dispatcher reshard run again: exit %d in %s\n%s%s", r.code, r.took.Round(time.Millisecond), r.out.String(), r.errOut.String())
	}
	// Run again after a complete run: it resumes the same change.
	r = reshard("--queue", q.Name, "--shards", fmt.Sprint(to), "--json")
	var doc struct {
		From, Shards int
		Resumed      bool
		Progress     struct{ Moved, Scanned int64 }
	}
	if err := json.Unmarshal(r.out.Bytes(), &doc); err != nil || r.code != 0 || !doc.Resumed || doc.From != from || doc.Shards != to {
		t.Errorf("dispatcher reshard run again: exit %d, %+v (%v), want a resumed change %d -> %d\n%s%s", r.code, doc, err, from, to, r.out.String(), r.errOut.String())
	}
	if l, err := shard.ReadLayout(ctx, h.rdb, keys); err != nil || l != (shard.Layout{Shards: to, From: from}) {
		t.Errorf("layout during the change: %+v, %v", l, err)
	}

	// finish, once the producer has long hashed with 64.
	time.Sleep(3 * time.Second)
	r = reshard("finish", "--queue", q.Name, "--json")
	t.Logf("dispatcher reshard finish: exit %d in %s\n%s%s", r.code, r.took.Round(time.Millisecond), r.out.String(), r.errOut.String())
	if r.err != nil || r.code != 0 {
		t.Fatalf("dispatcher reshard finish: exit %d, %v", r.code, r.err)
	}
	if l, err := shard.ReadLayout(ctx, h.rdb, keys); err != nil || l != (shard.Layout{Shards: to}) {
		t.Errorf("layout after finish: %+v, %v", l, err)
	}
	<-produced

	// Every steady task delivered, none early.
	wmu.Lock()
	t.Logf("producer: %d tasks scheduled at about %d/s, %d schedule errors retried, %d given up on at the end",
		len(want), len(want)/int(produce.Seconds()), prodErrs, len(uncertain))
	wmu.Unlock()
	deadline := time.Now().Add(dueWithin + 30*time.Second)
	for {
		mu.Lock()
		ids, _ := countIDs(got)
		mu.Unlock()
		if len(missing(want, ids)) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // late duplicates
	mu.Lock()
	all := append([]received(nil), got...)
	mu.Unlock()
	ids, dups := countIDs(all)
	miss := missing(want, ids)
	early, badHeader, unknown := 0, 0, 0
	var worst time.Duration
	for _, rc := range all {
		due, ok := want[rc.d.MessageId]
		if !ok {
			if !uncertain[rc.d.MessageId] {
				unknown++
			}
			continue
		}
		if v, ok := deliveryDue(rc.d); !ok || v != due {
			badHeader++
		}
		late := rc.at.Sub(time.UnixMilli(due))
		if late < -time.Millisecond {
			early++
		}
		worst = max(worst, late)
	}
	t.Logf("RESHARD %s: scheduled=%d delivered=%d missing=%d duplicates=%d worst_late_ms=%d early=%d",
		t.Name(), len(want), len(ids), len(miss), dups, worst.Milliseconds(), early)
	if len(miss) > 0 {
		t.Errorf("%d of %d tasks never arrived, e.g. %v", len(miss), len(want), first(miss))
	}
	if early > 0 {
		t.Errorf("%d deliveries arrived before their due time", early)
	}
	if badHeader > 0 {
		t.Errorf("%d deliveries without x-due-ms equal to their message_id's due time", badHeader)
	}
	if unknown > 0 {
		t.Errorf("%d deliveries of tasks never scheduled", unknown)
	}

	// Every task due in an hour is in its shard by 64 only; nothing else
	// is left.
	pipe := h.rdb.Pipeline()
	type where struct{ now, old *redis.FloatCmd }
	places := make([]where, len(far))
	for i, tk := range far {
		places[i].now = pipe.ZScore(ctx, keys.Pending(shard.Index(tk.Member, to)), string(tk.Member))
		if j := shard.Index(tk.Member, from); j != shard.Index(tk.Member, to) {
			places[i].old = pipe.ZScore(ctx, keys.Pending(j), string(tk.Member))
		}
	}
	var pending, inflight, dead, moving int64
	var cards []*redis.IntCmd
	for i := range to {
		cards = append(cards, pipe.ZCard(ctx, keys.Pending(i)), pipe.ZCard(ctx, keys.Inflight(i)), pipe.ZCard(ctx, keys.Dead(i)), pipe.Exists(ctx, keys.Moving(i)))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	misplaced := 0
	for i, tk := range far {
		if s, err := places[i].now.Result(); err != nil || int64(s) != tk.Due.UnixMilli() {
			misplaced++
			if misplaced < 5 {
				t.Errorf("%s: not pending in its shard by %d with its due time (%v, %v)", tk.Member, to, s, err)
			}
		}
		if places[i].old != nil && places[i].old.Err() != redis.Nil {
			misplaced++
			t.Errorf("%s still pending in its shard by %d: %v", tk.Member, from, places[i].old.Err())
		}
	}
	for i := 0; i < len(cards); i += 4 {
		pending, inflight, dead, moving = pending+cards[i].Val(), inflight+cards[i+1].Val(), dead+cards[i+2].Val(), moving+cards[i+3].Val()
	}
	t.Logf("tasks due in an hour (and the ballast, in 45 min): %d of %d in their shard by %d; left in Redis: pending %d, in flight %d, dead %d, moving hashes %d",
		len(far)-misplaced, len(far), to, pending, inflight, dead, moving)
	if pending != int64(len(far)) || inflight != 0 || dead != 0 || moving != 0 {
		t.Errorf("left pending %d (want the %d due in 45 min or more), in flight %d, dead %d, moving hashes %d", pending, len(far), inflight, dead, moving)
	}
}

// deliveryDue is the due time of a delivery's x-due-ms header, if any.
func deliveryDue(d amqp.Delivery) (int64, bool) {
	v, ok := d.Headers["x-due-ms"].(int64)
	return v, ok
}
