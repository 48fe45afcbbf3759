package admin

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestBatchScriptsCheckTypesFirst: a wrong-type key found by a batch
// requeue or purge changes nothing. Redis does not undo a script's writes
// when a later call fails: before the check, the first dead letter was
// requeued and then the batch failed (found in review).
func TestBatchScriptsCheckTypesFirst(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	q := Queue{Keys: shard.Keys{Prefix: prefix, Queue: "q"}, Shards: 1}
	var ds []Dead
	for i := range 3 {
		e := strconv.Itoa(1000+i) + ":task-" + strconv.Itoa(i)
		rdb.ZAdd(ctx, q.Keys.Dead(0), redis.Z{Score: float64(1000 + i), Member: e})
		d, _ := parseEntry(0, e)
		ds = append(ds, d)
	}
	for _, key := range []string{q.Keys.DeadReason(0), q.Keys.ClaimedBody(0), q.Keys.ClaimedProps(0), q.Keys.Tasks(0), q.Keys.Props(0)} {
		rdb.Set(ctx, key, "not a hash", 0)
		if _, err := RequeueBatch(ctx, rdb, q, 0, ds, 0); err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("requeue with a wrong-type %s: %v", key, err)
		}
		if key != q.Keys.Tasks(0) && key != q.Keys.Props(0) { // purge does not touch these
			if _, err := PurgeBatch(ctx, rdb, q, 0, ds); err == nil || !strings.Contains(err.Error(), key) {
				t.Fatalf("purge with a wrong-type %s: %v", key, err)
			}
		}
		rdb.Del(ctx, key)
	}
	if dead, pending := rdb.ZCard(ctx, q.Keys.Dead(0)).Val(), rdb.ZCard(ctx, q.Keys.Pending(0)).Val(); dead != 3 || pending != 0 {
		t.Fatalf("after the failed batches: %d dead, %d pending; want 3 and 0 (nothing changed)", dead, pending)
	}
}

// deadFixture writes dead letters as the dispatcher leaves them: the
// entry, its reason and, for a task with an id, the body and properties
// the claim set aside under the entry.
type deadFixture struct {
	t   *testing.T
	rdb *redis.Client
	q   Queue
}

func newDeadFixture(t *testing.T) *deadFixture {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	return &deadFixture{t: t, rdb: rdb, q: Queue{Keys: shard.Keys{Prefix: prefix, Queue: "q"}, Shards: 1}}
}

// kill dead-letters member due at due; body and props "" for none.
func (f *deadFixture) kill(member string, due int64, body, props string) Dead {
	f.t.Helper()
	ctx := context.Background()
	k := f.q.Keys
	e := strconv.FormatInt(due, 10) + ":" + member
	f.rdb.ZAdd(ctx, k.Dead(0), redis.Z{Score: float64(due), Member: e})
	f.rdb.HSet(ctx, k.DeadReason(0), e, "nacked")
	if body != "" {
		f.rdb.HSet(ctx, k.ClaimedBody(0), e, body)
	}
	if props != "" {
		f.rdb.HSet(ctx, k.ClaimedProps(0), e, props)
	}
	return f.one(member, due)
}

// one is member's dead letter due at due, as DeadEach reads it.
func (f *deadFixture) one(member string, due int64) Dead {
	f.t.Helper()
	ds, err := DeadOf(context.Background(), f.rdb, f.q, []byte(member))
	if err != nil {
		f.t.Fatal(err)
	}
	for _, d := range ds {
		if d.DueMs == due {
			return d
		}
	}
	f.t.Fatalf("%s due %d is not dead: %+v", member, due, ds)
	return Dead{}
}

// fields lists what the four task-id hashes hold.
func (f *deadFixture) fields() map[string]map[string]string {
	ctx := context.Background()
	k := f.q.Keys
	out := map[string]map[string]string{}
	for _, key := range []string{k.Tasks(0), k.Props(0), k.ClaimedBody(0), k.ClaimedProps(0)} {
		if h := f.rdb.HGetAll(ctx, key).Val(); len(h) > 0 {
			out[key] = h
		}
	}
	return out
}

// TestDeadLettersShowIDBodyAndProperties: a dead task with an id shows it,
// its body and properties (the claimed fields of its entry); one without
// is its own body, with properties if it had some; properties that are
// not JSON (why such a task died) show as a string.
func TestDeadLettersShowIDBodyAndProperties(t *testing.T) {
	f := newDeadFixture(t)
	d := f.kill("order-42", 1000, "the body", `{"routing_key":"r","headers":{"h":1}}`)
	if d.ID != "order-42" || d.Body != "the body" || string(d.Properties) != `{"routing_key":"r","headers":{"h":1}}` || d.Member != "order-42" || d.Reason != "nacked" ||
		d.MessageID != shard.MessageID([]byte("order-42"), 1000) {
		t.Errorf("task with an id: %+v", d)
	}
	d = f.kill("plain", 1001, "", `{"type":"tick"}`)
	if d.ID != "" || d.Body != "plain" || string(d.Properties) != `{"type":"tick"}` {
		t.Errorf("plain member with properties: %+v", d)
	}
	d = f.kill("broken", 1002, "b", `{"priority":`)
	b, err := json.Marshal(d)
	if err != nil || !strings.Contains(string(b), `"properties":"{\"priority\":"`) || !strings.Contains(string(b), `"id":"broken"`) {
		t.Errorf("properties that are not JSON: %s, %v", b, err)
	}
	if b, _ := json.Marshal(f.one("plain", 1001)); strings.Contains(string(b), `"id"`) {
		t.Errorf("a plain member has an id in JSON: %s", b)
	}
}

// TestRequeueRestoresBodyAndProperties: a requeued dead task with an id is
// pending again with the body and properties it died with, and its
// claimed fields are gone; a plain member comes back as its own body (a
// field the tasks hash had for it would have made it another task: it
// goes), one by one and in a batch.
func TestRequeueRestoresBodyAndProperties(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "one", true: "batch"}[batch], func(t *testing.T) {
			f := newDeadFixture(t)
			ctx := context.Background()
			k := f.q.Keys
			ds := []Dead{
				f.kill("order-42", 1000, "the body", `{"content_type":"text/plain"}`),
				f.kill("plain", 1001, "", ""),
				f.kill("tick", 1002, "", `{"type":"tick"}`),
			}
			f.rdb.HSet(ctx, k.Tasks(0), "plain", "stale")
			f.rdb.HSet(ctx, k.Props(0), "plain", `{"type":"stale"}`)
			if batch {
				res, err := RequeueBatch(ctx, f.rdb, f.q, 0, ds, 0)
				if err != nil || len(res) != 3 || res[0] != Done || res[1] != Done || res[2] != Done {
					t.Fatalf("RequeueBatch: %v, %v", res, err)
				}
			} else {
				for _, d := range ds {
					if ok, err := Requeue(ctx, f.rdb, f.q, d, 0); !ok || err != nil {
						t.Fatalf("Requeue %s: %v, %v", d.Member, ok, err)
					}
				}
			}
			for m, due := range map[string]float64{"order-42": 1000, "plain": 1001, "tick": 1002} {
				if s, err := f.rdb.ZScore(ctx, k.Pending(0), m).Result(); err != nil || s != due {
					t.Errorf("%s pending at %v, %v; want %v", m, s, err, due)
				}
			}
			want := map[string]map[string]string{
				k.Tasks(0): {"order-42": "the body"},
				k.Props(0): {"order-42": `{"content_type":"text/plain"}`, "tick": `{"type":"tick"}`},
			}
			if got := f.fields(); !reflect.DeepEqual(got, want) {
				t.Errorf("fields after the requeue:\n got %v\nwant %v", got, want)
			}
			if n := f.rdb.Exists(ctx, k.Dead(0), k.DeadReason(0)).Val(); n != 0 {
				t.Errorf("%d of the dead set and its reasons left", n)
			}
		})
	}
}

// TestRequeuePendingAgain: a dead task whose id a producer scheduled
// again is not requeued: the newer scheduling keeps its due time, body
// and properties, and the dead letter stays whole (body and properties
// too), to be purged or requeued once the newer one has gone.
func TestRequeuePendingAgain(t *testing.T) {
	f := newDeadFixture(t)
	ctx := context.Background()
	k := f.q.Keys
	d := f.kill("order-42", 1000, "old body", `{"type":"old"}`)
	f.rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 5000, Member: "order-42"})
	f.rdb.HSet(ctx, k.Tasks(0), "order-42", "new body")
	before := f.fields()
	if ok, err := Requeue(ctx, f.rdb, f.q, d, 0); ok || !errors.Is(err, ErrPending) {
		t.Fatalf("Requeue: %v, %v; want ErrPending", ok, err)
	}
	if res, err := RequeueBatch(ctx, f.rdb, f.q, 0, []Dead{d}, 7000); err != nil || res[0] != Pending {
		t.Fatalf("RequeueBatch: %v, %v; want Pending", res, err)
	}
	if s := f.rdb.ZScore(ctx, k.Pending(0), "order-42").Val(); s != 5000 {
		t.Errorf("the newer scheduling moved to %v", s)
	}
	if after := f.fields(); !reflect.DeepEqual(after, before) {
		t.Errorf("fields changed:\n before %v\n after %v", before, after)
	}
	if got := f.one("order-42", 1000); got.Body != "old body" || string(got.Properties) != `{"type":"old"}` {
		t.Errorf("the dead letter after: %+v", got)
	}
	// Once the newer one has gone (claimed), the requeue goes through.
	f.rdb.ZRem(ctx, k.Pending(0), "order-42")
	f.rdb.HDel(ctx, k.Tasks(0), "order-42")
	if ok, err := Requeue(ctx, f.rdb, f.q, d, 0); !ok || err != nil {
		t.Fatalf("Requeue after: %v, %v", ok, err)
	}
	if v := f.rdb.HGet(ctx, k.Tasks(0), "order-42").Val(); v != "old body" {
		t.Errorf("body after the requeue %q", v)
	}
}

// TestPurgeLeavesNoFields: a purged dead letter takes its claimed body
// and properties along, one by one and in a batch; the pending scheduling
// of the same id keeps its own.
func TestPurgeLeavesNoFields(t *testing.T) {
	f := newDeadFixture(t)
	ctx := context.Background()
	k := f.q.Keys
	a := f.kill("order-1", 1000, "one", `{"type":"a"}`)
	b := f.kill("order-2", 1001, "two", `{"type":"b"}`)
	c := f.kill("order-2", 1002, "two again", "")
	f.rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 9000, Member: "order-1"})
	f.rdb.HSet(ctx, k.Tasks(0), "order-1", "pending body")
	f.rdb.HSet(ctx, k.Props(0), "order-1", `{"type":"pending"}`)
	if ok, err := Purge(ctx, f.rdb, f.q, a); !ok || err != nil {
		t.Fatalf("Purge: %v, %v", ok, err)
	}
	if res, err := PurgeBatch(ctx, f.rdb, f.q, 0, []Dead{b, c, a}); err != nil || !reflect.DeepEqual(res, []Outcome{Done, Done, NotDead}) {
		t.Fatalf("PurgeBatch: %v, %v", res, err)
	}
	want := map[string]map[string]string{k.Tasks(0): {"order-1": "pending body"}, k.Props(0): {"order-1": `{"type":"pending"}`}}
	if got := f.fields(); !reflect.DeepEqual(got, want) {
		t.Errorf("fields after the purge:\n got %v\nwant %v", got, want)
	}
	if n := f.rdb.Exists(ctx, k.Dead(0), k.DeadReason(0)).Val(); n != 0 {
		t.Errorf("%d of the dead set and its reasons left", n)
	}
}

// TestPauseAndResumeWakeTheInstances: pause and resume each tell the
// instances on the queue's wake channel, so that a queue that dozes (and
// whose state is read rarely meanwhile) wakes and is read at once.
func TestPauseAndResumeWakeTheInstances(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	q := Queue{Keys: shard.Keys{Prefix: prefix, Queue: "q"}, Shards: 2}
	sub := rdb.Subscribe(ctx, q.Keys.Wake())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	heard := func(what string) {
		t.Helper()
		select {
		case m := <-sub.Channel():
			if m.Payload != shard.WakeBusy {
				t.Fatalf("%s: heard %q, want %q", what, m.Payload, shard.WakeBusy)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no wake-up on %s", what, q.Keys.Wake())
		}
	}
	if err := Pause(ctx, rdb, q, time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	heard("pause")
	if err := Resume(ctx, rdb, q); err != nil {
		t.Fatal(err)
	}
	heard("resume")
}
