package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestQuietQueuesSweepLess: the sweeps of queues with nothing new stretch
// out from POLL_INTERVAL to IDLE_POLL_INTERVAL, so idle queues cost Redis
// little; yet tasks scheduled a second ahead are still found before they
// are due, and a task ZADDed due at once (no wake-up) waits at most about
// IDLE_POLL_INTERVAL. A private Redis, so that only this dispatcher's reads
// are counted.
func TestQuietQueuesSweepLess(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	qs := []queueSpec{{Name: "qa", Shards: 4}, {Name: "qb", Shards: 4}, {Name: "qc", Shards: 4}}
	h := newHarnessOn(t, srv.Client(), qs...)
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	h.extra["DISPATCHER_POLL_INTERVAL"] = "20ms"
	h.extra["DISPATCHER_IDLE_POLL_INTERVAL"] = "400ms"
	h.start()
	time.Sleep(3 * time.Second) // started, and the sweeps stretched out

	// A sweep reads the two sets of every shard but one per queue with
	// ZRANGE: 3 queues x 3 shards x 2 = 18 reads. Every 20 ms that would
	// be 900 reads/s; every 400 ms it is 45.
	rate := commandRate(t, srv.Client(), "zrange", 3*time.Second)
	t.Logf("quiet: %.0f ZRANGE/s (900/s if swept every POLL_INTERVAL, 45/s every IDLE_POLL_INTERVAL)", rate)
	if rate > 900/4 {
		t.Errorf("quiet queues read %.0f ZRANGE/s: their sweeps did not stretch out", rate)
	}

	// Producers that only ZADD (no wake-up), a second ahead: found by a
	// stretched sweep before they are due.
	var ps []*shard.Producer
	for _, q := range qs {
		p := h.producer(q.Name)
		p.SetWakeWithin(0)
		ps = append(ps, p)
	}
	due := time.Now().Add(time.Second)
	want := map[string]map[string]int64{}
	for n, q := range qs {
		want[q.Name] = map[string]int64{}
		for i := 0; i < 10; i++ {
			m := []byte(fmt.Sprintf("ahead-%s-%d", q.Name, i))
			if err := ps[n].Schedule(context.Background(), m, due); err != nil {
				t.Fatal(err)
			}
			want[q.Name][shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
		}
	}
	// Each queue collected at once: receipt times are taken when read.
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := h.verify(q.Name, want[q.Name], 10*time.Second, 0)
			// Found at a sweep at most 400 ms after the ZADD, 600 ms before
			// due: the claim waits for the due time. Late by 400 ms means not
			// found in time.
			if o.WorstLate > 400*time.Millisecond {
				t.Errorf("queue %s: tasks scheduled 1 s ahead arrived up to %v late", q.Name, o.WorstLate)
			}
		}()
	}
	wg.Wait()

	// Quiet again; then a task due at once, by ZADD alone.
	time.Sleep(3 * time.Second)
	m := []byte("now")
	now := time.Now()
	if err := ps[1].Schedule(context.Background(), m, now); err != nil {
		t.Fatal(err)
	}
	o := h.verify("qb", map[string]int64{shard.MessageID(m, now.UnixMilli()): now.UnixMilli()}, 10*time.Second, 0)
	t.Logf("a raw ZADD due at once on a quiet queue arrived %v after its due time (IDLE_POLL_INTERVAL 400ms)", o.WorstLate)
	if o.WorstLate > 2*time.Second {
		t.Errorf("a task due at once waited %v, far over IDLE_POLL_INTERVAL", o.WorstLate)
	}
}

// commandRate is how many calls of a Redis command per second the server
// ran over d (INFO commandstats).
func commandRate(t *testing.T, rdb *redis.Client, cmd string, d time.Duration) float64 {
	t.Helper()
	calls := func() int64 {
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls=")
			if ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	before, began := calls(), time.Now()
	time.Sleep(d)
	return float64(calls()-before) / time.Since(began).Seconds()
}

// TestWakeUpFromPython proves the contract's wake-up message from another
// language: tests/testdata/producer_wake.py, written from CONTRACT.md,
// ZADDs tasks due now and PUBLISHes due:<i>:<due_ms> in the same pipeline;
// with sweeps an hour apart (on a grid: the next one may come at any
// time within the hour, but hardly in the seconds the test waits) the
// dispatcher must still deliver them at once.
func TestWakeUpFromPython(t *testing.T) {
	if out, err := exec.Command(systemPython, "-c", "import redis, xxhash").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import redis and xxhash (%v): run scripts/dev.sh test, "+
			"which installs python3-redis python3-xxhash\n%s", systemPython, err, out)
	}
	const shards = 4
	h := newHarness(t, queueSpec{Name: "pywake", Shards: shards})
	h.extra["DISPATCHER_POLL_INTERVAL"] = "1h"
	h.start()
	time.Sleep(time.Second) // connected, subscribed, first sweep done
	req, err := json.Marshal(map[string]any{"url": testenv.RedisURL(t), "prefix": h.prefix, "queue": "pywake",
		"shards": shards, "count": 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, systemPython, "testdata/producer_wake.py")
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(req), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python producer: %v\nstderr:\n%s", err, stderr.String())
	}
	var out struct {
		Tasks []pyTask `json:"tasks"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || len(out.Tasks) != 5 {
		t.Fatalf("python producer printed %q: %v", stdout.String(), err)
	}
	want := map[string]int64{}
	for _, task := range out.Tasks {
		want[task.MessageID] = task.DueMs
	}
	// Receipts are stamped when read: the producer is quick, so its tasks
	// wait little in the consumer's buffer before verify reads them.
	o := h.verify("pywake", want, 8*time.Second, 0)
	t.Logf("woken by a Python producer: worst %v after due (sweeps an hour apart)", o.WorstLate)
	if o.WorstLate > 3*time.Second {
		t.Errorf("tasks waited up to %v: the wake-up did not wake the dispatcher", o.WorstLate)
	}
}
