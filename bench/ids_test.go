package bench

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

func TestParseIDsOption(t *testing.T) {
	for args, want := range map[string][]bool{
		"":                   {false},
		"-ids":               {true},
		"-ids=off,on":        {false, true},
		"-ids off,on":        {false, true},
		"-ids on -mode rate": {true},
		"-ids -mode rate":    {true},
		"-ids=false":         {false},
		"-ids on,off,on":     {true, false},
	} {
		o, err := parseOptions(strings.Fields(args), io.Discard)
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if !slices.Equal(o.IDs, want) {
			t.Errorf("%q: ids %v, want %v", args, o.IDs, want)
		}
	}
	for args, want := range map[string]string{
		"-ids=maybe":       `"maybe": want on or off`,
		"-ids maybe":       `unexpected argument "maybe"`,
		"-props":           "-props: only tasks with an id",
		"-ids=off -props":  "-props: only tasks with an id",
		"-ids=off,,":       "",
		"-ids=on,x -props": `"x"`,
	} {
		_, err := parseOptions(strings.Fields(args), io.Discard)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %s", args, err, want)
		}
	}
}

func TestPlanSweepsIDs(t *testing.T) {
	o, err := parseOptions([]string{"-mode", "memory,rate,idle", "-ids", "off,on", "-props", "-backlog", "1000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range plan(o) {
		got = append(got, p.String())
	}
	want := []string{
		"memory N=1,000 shards=16 size=200",
		"memory N=1,000 shards=16 size=200 ids+props",
		"rate 2,000/s instances=1 shards=16 batch=500 size=200",
		"rate 2,000/s instances=1 shards=16 batch=500 size=200 ids+props",
		"idle background (no instance) pending=0",
		"idle instances=1 shards=16 pending=0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The plain point's JSON is as it was.
	b, _ := json.Marshal(plan(o)[0])
	if strings.Contains(string(b), "ids") || strings.Contains(string(b), "props") {
		t.Errorf("plain point JSON %s", b)
	}
}

func TestTaskProps(t *testing.T) {
	for _, i := range []int{0, 17, 99_999_999} {
		raw := taskProps(nil, i)
		p, err := shard.ParseProperties(raw)
		if err != nil {
			t.Fatalf("task %d: %s: %v", i, raw, err)
		}
		tp, _ := p.Headers["traceparent"].(string)
		if len(tp) != 55 || traceIDOf(tp) != string(traceID(nil, i)) {
			t.Errorf("task %d: traceparent %q", i, tp)
		}
		if len(raw) != 85 {
			t.Errorf("task %d: %d bytes of properties, want 85 (the docs say so)", i, len(raw))
		}
	}
	if string(taskID(nil, 42)) != "t42" {
		t.Errorf("taskID(42) = %q", taskID(nil, 42))
	}
}

// idDelivery is task i scheduled by id, as the dispatcher sends it.
func idDelivery(i int, dueMs int64, id string, props bool) *amqp.Delivery {
	h := amqp.Table{"x-due-ms": dueMs, "x-task-id": id}
	if props {
		tp := "00-" + string(traceID(nil, i)) + "-00f067aa0ba902b7-01" // a tracer's span as parent
		h["traceparent"] = tp
	}
	return &amqp.Delivery{Body: member(nil, i, 200), MessageId: shard.MessageID([]byte(id), dueMs), Headers: h}
}

func TestRecorderChecksTaskIDs(t *testing.T) {
	const due = int64(1_700_000_000_000)
	now := time.UnixMilli(due + 2)
	rec := newRecorder(6, 4, -1000)
	rec.expectIDs(true)
	rec.record(idDelivery(0, due, "t0", true), now)
	rec.record(idDelivery(1, due, "t2", true), now) // another task's id
	d := idDelivery(2, due, "t2", true)
	delete(d.Headers, "x-task-id") // none
	rec.record(d, now)
	rec.record(idDelivery(3, due, "t3", false), now) // properties lost
	d = idDelivery(4, due, "t4", true)
	d.Headers["traceparent"] = "00-" + string(traceID(nil, 5)) + "-00f067aa0ba902b7-01" // another task's
	rec.record(d, now)
	d = delivery(5, due, nil) // message_id of the body, not of the id
	d.Headers["x-task-id"] = "t5"
	d.Headers["traceparent"] = "00-" + string(traceID(nil, 5)) + "-00f067aa0ba902b7-01"
	rec.record(d, now)
	// t2's message_id does not match task 1's id either.
	if rec.unique.Load() != 6 || rec.badTaskID.Load() != 4 || rec.badID.Load() != 2 {
		t.Errorf("unique %d, bad task id %d, bad message_id %d; want 6, 4, 2", rec.unique.Load(), rec.badTaskID.Load(), rec.badID.Load())
	}
	// The shard is the id's, as the contract hashes it.
	if got, want := rec.shardOf[0], uint16(shard.Index([]byte("t0"), 4)); got != want {
		t.Errorf("task 0 counted in shard %d, want %d", got, want)
	}

	plain := newRecorder(2, 4, -1000)
	plain.record(delivery(0, due, nil), now)
	d = delivery(1, due, nil)
	d.Headers["x-task-id"] = "t1"
	plain.record(d, now)
	if plain.badTaskID.Load() != 1 || plain.badID.Load() != 0 {
		t.Errorf("plain: bad task id %d, bad message_id %d; want 1, 0", plain.badTaskID.Load(), plain.badID.Load())
	}
}

// Tasks with an id end to end, against plain ones in the same run: the
// consumer gets every task with its x-task-id and properties, the bench's
// own MULTI/HSET/EXEC stay out of the Redis counts, memory is measured,
// and the new keys are cleaned up.
func TestBenchIDs(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	code, stdout, stderr := runBenchOn(t, srv.URL(),
		"-mode", "backlog,rate,memory", "-ids", "off,on", "-props", "-backlog", "2000", "-rate", "500", "-duration", "2s",
		"-shards", "4", "-batch", "200", "-size", "100", "-queue-type", "transient",
		"-ceiling-count", "1000", "-ceiling-window", "300", "-stall", "20s", "-json", jsonPath, "-dispatcher", binary)
	t.Logf("stdout:\n%s", stdout)
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| size B | form | tasks/s |", "| 100 | ids+props | whole run |", "| 4 | 100 | plain |", "| member B | form | bytes/task |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 || len(rep.Results) != 4 || len(rep.Memory) != 2 {
		t.Fatalf("failures %q, %d results, %d memory results", rep.Failures, len(rep.Results), len(rep.Memory))
	}
	var names []string
	for _, r := range rep.Results {
		want := 2000
		if r.Mode == modeRate {
			want = 1000
		}
		checkResult(t, r, want)
		if r.BadTaskID != 0 || r.IDs != r.Props {
			t.Errorf("%s: %d with a bad task id; ids %v props %v", r.Point, r.BadTaskID, r.IDs, r.Props)
		}
		if r.Mode == modeRate {
			// The producer's own commands are taken out: none of the
			// dispatcher's is a MULTI or an EXEC.
			sub := r.Redis.Subtracted
			if r.IDs && (sub["multi"] == 0 || sub["multi"] != sub["exec"] || sub["hset"] != 2*sub["zadd"] || r.Redis.ByCommand["multi"] != 0) ||
				!r.IDs && (sub["zadd"] == 0 || sub["multi"] != 0 || sub["hset"] != 0) {
				t.Errorf("%s: subtracted %v, counted %v", r.Point, sub, r.Redis.ByCommand)
			}
		}
		names = append(names, r.Name)
	}
	plain, ids := rep.Memory[0], rep.Memory[1]
	if plain.IDs || !ids.IDs || !ids.Props || plain.PerTask <= 100 || ids.PerTask <= plain.PerTask {
		t.Errorf("memory: plain %+v, ids %+v", plain, ids)
	}
	assertCleanedUpIn(t, srv.Client(), rep.RunID, names...)
}

// A command of a write with ids that fails inside its MULTI/EXEC (whose
// own reply is then fine) is an error all the same.
func TestWriteShardsFailsInsideExec(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	testenv.CleanRedis(t, rdb, k.Prefix)
	f := &taskForm{ids: true}
	by := map[int]*shardWrite{}
	f.add(by, k, 0, 1, 1, 32, 1000)
	if err := writeShards(ctx, rdb, []*shardWrite{by[0]}); err != nil {
		t.Fatal(err)
	}
	if n := rdb.HLen(ctx, k.Tasks(0)).Val(); n != 1 || rdb.ZScore(ctx, k.Pending(0), "t1").Val() != 1000 {
		t.Fatalf("tasks hash has %d fields, t1 due %v", n, rdb.ZScore(ctx, k.Pending(0), "t1").Val())
	}
	// The tasks hash is a string now: the HSET fails at EXEC.
	rdb.Set(ctx, k.Tasks(0), "x", 0)
	by = map[int]*shardWrite{}
	f.add(by, k, 0, 1, 2, 32, 2000)
	err := writeShards(ctx, rdb, []*shardWrite{by[0]})
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("write into a wrong-type hash: %v", err)
	}
}

// On a cluster each shard's MULTI/EXEC goes to the shard's primary (a
// TxPipeline of its own): every task arrives with its id and properties,
// and the producer's commands are taken out of each primary's counts.
func TestBenchRedisClusterIDs(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	var out, errOut strings.Builder
	code := Main([]string{"-redis", cluster.URL(), "-amqp", testenv.AMQPURL(t),
		"-mode", "rate", "-ids", "-props", "-rate", "500", "-duration", "2s", "-shards", "16", "-batch", "200", "-size", "100",
		"-queue-type", "transient", "-stall", "20s", "-json", jsonPath, "-dispatcher", binary}, &out, &errOut)
	t.Logf("stdout:\n%s", out.String())
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, errOut.String())
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 || len(rep.Results) != 1 {
		t.Fatalf("failures %q, %d results", rep.Failures, len(rep.Results))
	}
	r := rep.Results[0]
	checkResult(t, r, 1000)
	if !r.IDs || !r.Props || r.BadTaskID != 0 {
		t.Errorf("%s: ids %v props %v, %d with a bad task id", r.Point, r.IDs, r.Props, r.BadTaskID)
	}
	var multi int64
	for _, p := range r.Redis.Primaries {
		multi += p.Subtracted["multi"]
		if p.ByCommand["multi"] != 0 || p.ByCommand["exec"] != 0 {
			t.Errorf("%s: the producer's transactions counted on %s: %v", r.Point, p.Addr, p.ByCommand)
		}
	}
	if multi == 0 || multi != r.Redis.Subtracted["zadd"] {
		t.Errorf("%s: %d MULTI subtracted, %d ZADD", r.Point, multi, r.Redis.Subtracted["zadd"])
	}
}
