package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/shard"
)

// delivery is task i as a dispatcher sends it, due at dueMs; pubUs is
// x-published-us (nil: no header).
func delivery(i int, dueMs int64, pubUs any) *amqp.Delivery {
	body := member(nil, i, 32)
	h := amqp.Table{"x-due-ms": dueMs}
	if pubUs != nil {
		h["x-published-us"] = pubUs
	}
	return &amqp.Delivery{Body: body, MessageId: shard.MessageID(body, dueMs), Headers: h}
}

func TestRecorderTwoViews(t *testing.T) {
	const due = int64(1_700_000_000_000) // ms
	rec := newRecorder(4, 4, -1000)
	rec.keepDue()
	at := func(ms float64) time.Time { return time.UnixMicro(due*1000 + int64(ms*1000)) }
	// Stamped 0.5 ms after due, received 2 ms after; int32 and int64
	// headers alike.
	rec.record(delivery(0, due, due*1000+500), at(2))
	rec.record(delivery(1, due+300, int64((due+300)*1000+1500)), at(300+4))
	rec.record(delivery(1, due+300, int64((due+300)*1000+1500)), at(300+9)) // a duplicate: not a sample
	// Due 1.2 s after the first: outside the first second.
	rec.record(delivery(2, due+1200, int32(7000)), at(1200+12)) // an int32 can only hold a small value: far "early"
	rec.record(delivery(3, due+1500, "not a number"), at(1500+1))

	if rec.unique.Load() != 4 || rec.dups.Load() != 1 || rec.unstamped.Load() != 1 || rec.early.Load() != 0 ||
		rec.badID.Load() != 0 || rec.malformed.Load() != 0 {
		t.Fatalf("counts: unique %d dups %d unstamped %d early %d bad id %d malformed %d", rec.unique.Load(), rec.dups.Load(),
			rec.unstamped.Load(), rec.early.Load(), rec.badID.Load(), rec.malformed.Load())
	}
	consumer, dispatch := rec.views(nil)
	if got, want := consumer, []int32{2000, 4000, 12000, 1000}; !slices.Equal(got, want) {
		t.Errorf("consumer view %v, want %v", got, want)
	}
	// Task 2's int32 stamp is read as it is (7000 µs since the epoch):
	// far before its due time, clamped to what an int32 holds.
	if got, want := dispatch, []int32{500, 1500, noStamp + 1}; !slices.Equal(got, want) {
		t.Errorf("dispatch view %v, want %v", got, want)
	}

	c, d, from, ok := rec.startWindow(time.Second)
	if !ok || from != due || !slices.Equal(c, []int32{2000, 4000}) || !slices.Equal(d, []int32{500, 1500}) {
		t.Errorf("first second from %d (%v): consumer %v, dispatch %v", from, ok, c, d)
	}
	// The rest, the steady traffic: tasks 2 and 3, due 1.2 and 1.5 s in
	// (due in [due+1000, due+1501)).
	c2, d2, from2, ms2, ok := rec.afterWindow(time.Second)
	if !ok || from2 != due+1000 || ms2 != 501 || !slices.Equal(c2, []int32{12000, 1000}) || !slices.Equal(d2, []int32{noStamp + 1}) {
		t.Errorf("after the first second from %d for %d ms (%v): consumer %v, dispatch %v", from2, ms2, ok, c2, d2)
	}
	// The views of the whole run, as finish reports them.
	if dd := distOrNil(dispatch, true); dd == nil || dd.Count != 3 || len(dd.Curve) == 0 {
		t.Errorf("dispatch dist %+v", dd)
	}
	if cd := distNoCurve(c); cd.Count != 2 || cd.P50 != 2 || cd.Max != 4 || cd.Curve != nil {
		t.Errorf("first-second consumer dist %+v", cd)
	}
}

// An older dispatcher sends no x-published-us: the dispatch view is
// absent, not zero.
func TestRecorderWithoutStamps(t *testing.T) {
	const due = int64(1_700_000_000_000)
	rec := newRecorder(3, 1, -1000)
	for i := range 3 {
		rec.record(delivery(i, due, nil), time.UnixMilli(due+3))
	}
	consumer, dispatch := rec.views(nil)
	if len(consumer) != 3 || dispatch != nil || rec.unstamped.Load() != 3 {
		t.Fatalf("consumer %v, dispatch %v, unstamped %d", consumer, dispatch, rec.unstamped.Load())
	}
	if d := distOrNil(dispatch, true); d != nil {
		t.Errorf("dispatch view %+v, want none", d)
	}
	if _, _, _, ok := rec.startWindow(time.Second); ok {
		t.Error("a start window without keepDue")
	}
	if got := latCell(nil); got != "-" {
		t.Errorf("latCell(nil) = %q", got)
	}
	if got := latCell(&Dist{Count: 1, P50: 1.5, P99: 2, P999: 12.34, Max: 150}); got != "1.50 / 2.00 / 12.3 / 150" {
		t.Errorf("latCell = %q", got)
	}
}

func TestIntHeader(t *testing.T) {
	h := amqp.Table{"a": int64(-5), "b": int32(7), "c": "8", "d": 1.5, "e": uint32(9)}
	for name, want := range map[string]int64{"a": -5, "b": 7, "e": 9} {
		if v, ok := intHeader(h, name); !ok || v != want {
			t.Errorf("intHeader(%s) = %d, %v; want %d", name, v, ok, want)
		}
	}
	for _, name := range []string{"c", "d", "missing"} {
		if v, ok := intHeader(h, name); ok {
			t.Errorf("intHeader(%s) = %d, want none", name, v)
		}
	}
	// The due time may come as an int32 too, or else from the message_id.
	if due, ok := dueOf(&amqp.Delivery{Headers: amqp.Table{"x-due-ms": int32(42)}}); !ok || due != 42 {
		t.Errorf("dueOf int32: %d %v", due, ok)
	}
	if due, ok := dueOf(&amqp.Delivery{MessageId: "0123456789abcdef-77"}); !ok || due != 77 {
		t.Errorf("dueOf message_id: %d %v", due, ok)
	}
}

func TestInstanceEnv(t *testing.T) {
	t.Setenv("DISPATCHER_STAMP_PUBLISHED", "false") // the user's: never passed on
	t.Setenv("DISPATCHER_PIPELINE", "8")            // passed on
	t.Setenv("DISPATCHER_QUEUE_OTHER_SHARDS", "3")  // not passed on
	sp := instanceSpec{redisURL: "redis://h:1/0", amqpURL: "amqp://h/", prefix: "p", exchange: "x",
		queues: queueNames(3), shards: 8, batch: 100, clientName: "c", stamp: true}
	env, err := sp.env(0, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Errorf("%s set twice", k)
		}
		got[k] = v
	}
	for k, want := range map[string]string{
		"DISPATCHER_QUEUES":                    "bench,bench-2,bench-3",
		"DISPATCHER_QUEUE_BENCH_SHARDS":        "8",
		"DISPATCHER_QUEUE_BENCH_EXCHANGE":      "x",
		"DISPATCHER_QUEUE_BENCH_3_SHARDS":      "8",
		"DISPATCHER_QUEUE_BENCH_3_EXCHANGE":    "x",
		"DISPATCHER_STAMP_PUBLISHED":           "true",
		"DISPATCHER_PIPELINE":                  "8",
		"DISPATCHER_QUEUE_OTHER_SHARDS":        "",
		"DISPATCHER_BATCH_SIZE":                "100",
		"DISPATCHER_KEY_PREFIX":                "p",
		"DISPATCHER_QUEUE_BENCH_2_ROUTING_KEY": "",
	} {
		if got[k] != want {
			t.Errorf("%s=%q, want %q", k, got[k], want)
		}
	}
	sp.stamp = false
	env, _ = sp.env(0, "127.0.0.1:1")
	for _, kv := range env {
		if strings.HasPrefix(kv, "DISPATCHER_STAMP_PUBLISHED=") {
			t.Errorf("without stamping: %s", kv)
		}
	}
	if n := queueNames(1000); len(n) != 1000 || n[999] != "bench-1000" || config.EnvName("a.b-c_9") != "A_B_C_9" {
		t.Errorf("queue names %v..., env name %s", n[:3], config.EnvName("a.b-c_9"))
	}
}

// The dispatcher this test suite built knows DISPATCHER_STAMP_PUBLISHED
// when its config does; /bin/true knows nothing.
func TestKnowsSetting(t *testing.T) {
	if knowsSetting(t.Context(), "/bin/true", stampVar) {
		t.Error("/bin/true knows " + stampVar)
	}
	if !knowsSetting(t.Context(), binary, "DISPATCHER_QUEUES") {
		t.Error("the dispatcher does not list DISPATCHER_QUEUES in its --help")
	}
}
