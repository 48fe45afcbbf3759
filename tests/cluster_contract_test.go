package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// systemPython is Debian's interpreter, which has python3-redis and
// python3-xxhash from scripts/dev.sh; the python3 first on PATH may be
// another one without them.
const systemPython = "/usr/bin/python3"

// pyTask is one task as the Python producer scheduled it.
type pyTask struct {
	Member    string `json:"member"`
	Key       string `json:"key"`
	Shard     int    `json:"shard"`
	DueMs     int64  `json:"due_ms"`
	MessageID string `json:"message_id"`
}

// TestClusterContractPythonProducer proves the contract from a non-Go
// producer on Redis Cluster: tests/testdata/producer_cluster.py checks the
// XXH64 test vectors, ZADDs tasks through redis-py's RedisCluster and
// prints the message ids it expects; one dispatcher on the cluster must
// deliver exactly those, with the bodies unchanged, persistent, none early,
// while the queue's 16 shards live on all three primaries.
func TestClusterContractPythonProducer(t *testing.T) {
	if out, err := exec.Command(systemPython, "-c", "import redis.cluster, xxhash").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import redis.cluster and xxhash (%v): run scripts/dev.sh test, "+
			"which installs python3-redis python3-xxhash\n%s", systemPython, err, out)
	}
	const (
		queue  = "py-orders"
		shards = 16
		count  = 300
	)
	cluster := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	rdb := cluster.Client()
	h := newHarnessOn(t, rdb, queueSpec{Name: queue, Shards: shards})
	h.extra["DISPATCHER_REDIS_URL"] = cluster.URL()
	p := h.start()
	ctx := context.Background()

	primaries := cluster.Primaries()
	if len(primaries) != 3 {
		t.Fatalf("cluster has %d primaries, want 3", len(primaries))
	}
	var seeds []string
	for _, n := range primaries {
		seeds = append(seeds, n.Addr)
	}
	due0 := time.Now().Add(1500 * time.Millisecond).UnixMilli()
	req, err := json.Marshal(map[string]any{
		"seeds": seeds, "prefix": h.prefix, "queue": queue, "shards": shards,
		"count": count, "due_ms": due0, "spread_ms": 500,
	})
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(pctx, systemPython, "testdata/producer_cluster.py")
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(req), &stdout, &stderr
	started := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("python producer: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), tail(stdout.String(), 2000))
	}
	var res struct {
		Tasks     []pyTask `json:"tasks"`
		Vectors   int      `json:"vectors"`
		WrittenMs int64    `json:"written_ms"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("python producer output: %v\n%s", err, tail(stdout.String(), 2000))
	}
	t.Logf("python producer: %d tasks in %s, %d test vectors checked; last ZADD %d ms before the first due time",
		len(res.Tasks), time.Since(started).Round(time.Millisecond), res.Vectors, due0-res.WrittenMs)
	if res.Vectors != 5 || len(res.Tasks) != count {
		t.Fatalf("python producer checked %d vectors and scheduled %d tasks, want 5 and %d", res.Vectors, len(res.Tasks), count)
	}

	// What Python computed must be what the contract says, computed here.
	want := map[string]pyTask{}
	wantDue := map[string]int64{}
	byKey := map[string]int{}
	kinds := map[string]int{}
	for _, tk := range res.Tasks {
		m := []byte(tk.Member)
		h64 := xxhash.Sum64(m)
		key := fmt.Sprintf("%s:{%s:%d}", h.prefix, queue, h64%shards)
		id := fmt.Sprintf("%016x-%d", h64, tk.DueMs)
		if tk.Key != key || tk.Shard != int(h64%shards) || tk.MessageID != id {
			t.Fatalf("python task %q: key %q shard %d id %q; the contract gives %q %d %q",
				tk.Member, tk.Key, tk.Shard, tk.MessageID, key, h64%shards, id)
		}
		if _, dup := want[id]; dup {
			t.Fatalf("python produced message id %s twice", id)
		}
		want[id] = tk
		wantDue[id] = tk.DueMs
		byKey[key]++
		switch {
		case strings.ContainsRune(tk.Member, 'з'):
			kinds["non-ASCII"]++
		case strings.ContainsAny(tk.Member, "{}"):
			kinds["braces"]++
		}
	}
	if kinds["non-ASCII"] == 0 || kinds["braces"] == 0 {
		t.Fatalf("python members lack a kind: %v", kinds)
	}
	if time.Now().Add(200 * time.Millisecond).Before(time.UnixMilli(due0)) {
		var pending int64
		for key := range byKey {
			pending += rdb.ZCard(ctx, key).Val()
		}
		if pending != count {
			t.Errorf("after the python producer, %d tasks pending in its keys, want %d", pending, count)
		}
	} else {
		t.Logf("python producer finished too close to the first due time to count pending tasks")
	}

	// One queue, several primaries.
	if len(byKey) != shards {
		t.Errorf("tasks landed in %d shard keys, want all %d", len(byKey), shards)
	}
	placement := map[string][]string{}
	for key := range byKey {
		addr := cluster.PrimaryOf(key).Addr
		placement[addr] = append(placement[addr], key)
	}
	for addr, ks := range placement {
		sort.Strings(ks)
		t.Logf("primary %s holds %d shard keys: %v", addr, len(ks), ks)
	}
	if len(placement) != len(primaries) {
		t.Errorf("the %d shard keys are on %d primaries, want all %d", len(byKey), len(placement), len(primaries))
	}

	got := h.collect(queue, count, 30*time.Second)
	ids, dups := countIDs(got)
	if miss := missing(wantDue, ids); len(miss) > 0 {
		sort.Strings(miss)
		t.Errorf("%d of %d tasks never delivered, e.g. %v", len(miss), count, miss[:min(5, len(miss))])
	}
	if dups > 0 {
		t.Errorf("%d duplicate deliveries", dups)
	}
	var worst time.Duration
	for _, r := range got {
		tk, ok := want[r.d.MessageId]
		if !ok {
			t.Errorf("unexpected message id %q, body %q", r.d.MessageId, r.d.Body)
			continue
		}
		if !bytes.Equal(r.d.Body, []byte(tk.Member)) {
			t.Errorf("%s: body %q, want %q", r.d.MessageId, r.d.Body, tk.Member)
		}
		if r.d.DeliveryMode != 2 {
			t.Errorf("%s: delivery mode %d, want 2 (persistent)", r.d.MessageId, r.d.DeliveryMode)
		}
		if r.d.Exchange != h.queues[0].Exchange || r.d.RoutingKey != queue {
			t.Errorf("%s: exchange %q routing key %q", r.d.MessageId, r.d.Exchange, r.d.RoutingKey)
		}
		due := time.UnixMilli(tk.DueMs)
		if r.at.Before(due) {
			t.Errorf("%s received %s before its due time", r.d.MessageId, due.Sub(r.at))
		}
		worst = max(worst, r.at.Sub(due))
	}
	t.Logf("%d deliveries of %d tasks; worst lateness at the consumer %s", len(got), count, worst)

	eventually(t, 10*time.Second, "no tasks left in Redis", func() bool {
		pend, inflight, dead := h.leftovers(h.queues[0])
		return pend+inflight+dead == 0
	})
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("dispatcher logged an error: %s", line)
		}
	}
}
