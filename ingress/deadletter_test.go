package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/amqptable"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestConvertRefusalsBecomeDeadLetters: each bad task gets a reason naming
// the header and the value and a dead letter due at its base time with its
// body and properties; what JSON cannot hold (a NaN header, an expiration
// that is no number) is left out of the dead letter and the reason says
// so; a malformed cancel gets no dead letter (it goes to the DLX).
func TestConvertRefusalsBecomeDeadLetters(t *testing.T) {
	g := New(nil, nil, Options{Queue: "q", MaxDelay: time.Hour, MaxBodyBytes: 10})
	const now = int64(1_800_000_000_000)
	cases := []struct {
		name, reason string
		d            amqp.Delivery
		dueMs        int64
		headers      []string // kept in the dead letter's amqp_headers
		noExpiration bool
	}{
		{name: "string delay", reason: "header x-delay is 5000 (string): not an integer",
			d: amqp.Delivery{MessageId: "a", Body: []byte("b"), Headers: amqp.Table{"x-delay": "5000", "k": int16(3)}}, dueMs: now, headers: []string{"k", "x-delay"}},
		{name: "received time is the base", reason: "header x-delay is 1.5 (float64): not an integer",
			d: amqp.Delivery{MessageId: "a", Headers: amqp.Table{"x-delay": 1.5, "timestamp_in_ms": int64(now - 5000)}}, dueMs: now - 5000, headers: []string{"timestamp_in_ms", "x-delay"}},
		{name: "beyond max delay", reason: "header x-delay is 7200000: due time",
			d: amqp.Delivery{MessageId: "a", Headers: amqp.Table{"x-delay": int32(7_200_000)}}, dueMs: now, headers: []string{"x-delay"}},
		{name: "body too large", reason: "body is 11 bytes, over DISPATCHER_MAX_MESSAGE_BYTES=10",
			d: amqp.Delivery{MessageId: "a", Body: []byte("01234567890")}, dueMs: now},
		{name: "NaN header", reason: `header "f" is NaN: JSON holds no NaN or infinity (stored with the header "f" left out)`,
			d: amqp.Delivery{MessageId: "a", Headers: amqp.Table{"f": math.NaN(), "x-delay": int32(5)}}, dueMs: now, headers: []string{"x-delay"}},
		{name: "bad expiration", reason: `expiration "soon": not a whole number of ms (stored with the expiration "soon" left out)`,
			d: amqp.Delivery{MessageId: "a", Expiration: "soon"}, dueMs: now, noExpiration: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.d.RoutingKey, c.d.ContentType = "rk", "text/plain"
			it := g.convert(c.d, now)
			if !strings.Contains(it.reason, c.reason) || it.task != nil {
				t.Fatalf("reason %q (task %v), want one with %q", it.reason, it.task, c.reason)
			}
			if it.dead == nil {
				t.Fatal("no dead letter")
			}
			if string(it.dead.id) != "a" || string(it.dead.body) != string(c.d.Body) || it.dead.dueMs != c.dueMs {
				t.Errorf("dead letter id %q body %q due %d, want a %q %d", it.dead.id, it.dead.body, it.dead.dueMs, c.d.Body, c.dueMs)
			}
			var p shard.Properties
			if err := json.Unmarshal(it.dead.props, &p); err != nil {
				t.Fatalf("properties %s: %v", it.dead.props, err)
			}
			if p.RoutingKey != "rk" || p.ContentType != "text/plain" || p.MessageID != "a" || (c.noExpiration && p.ExpirationMs != nil) {
				t.Errorf("properties %s", it.dead.props)
			}
			var names []string
			if len(p.AMQPHeaders) > 0 {
				h, err := amqptable.Decode(p.AMQPHeaders)
				if err != nil {
					t.Fatal(err)
				}
				for k := range h {
					names = append(names, k)
				}
			}
			if strings.Join(slices.Sorted(slices.Values(names)), ",") != strings.Join(c.headers, ",") {
				t.Errorf("headers kept %v, want %v", names, c.headers)
			}
		})
	}
	for _, v := range []any{"yes", false} {
		it := g.convert(amqp.Delivery{MessageId: "a", Headers: amqp.Table{"x-dispatcher-cancel": v}}, now)
		if it.reason == "" || it.dead != nil {
			t.Errorf("cancel %v: reason %q dead letter %v, want a reason and none", v, it.reason, it.dead)
		}
	}
}

// TestStoreDead: dead letters are written as the scanner writes them (an
// entry with its reason, claimed body and properties), the same message
// again rewrites its entry, an entry in flight moves to the next free ms,
// and a shard whose dead-letter key Redis refuses marks only its own dead
// letters unstored.
func TestStoreDead(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	ctx := context.Background()
	prod, err := shard.NewProducer(rdb, prefix, "q", 4)
	if err != nil {
		t.Fatal(err)
	}
	g := New(rdb, prod, Options{Queue: "q"})
	k := prod.Keys()
	// Two ids in different shards.
	idA, idB := "a", "b"
	for n := 0; shard.Index([]byte(idB), 4) == shard.Index([]byte(idA), 4); n++ {
		idB = "b" + string(rune('0'+n))
	}
	iA, iB := shard.Index([]byte(idA), 4), shard.Index([]byte(idB), 4)
	// A task of id a due at 1000 is in flight.
	rdb.ZAdd(ctx, k.Inflight(iA), redis.Z{Score: 99999, Member: "1000:" + idA})
	items := []item{
		{reason: "r1", dead: &deadLetter{id: []byte(idA), body: []byte("body-a"), props: []byte(`{"routing_key":"x"}`), dueMs: 1000}},
		{reason: "r2", dead: &deadLetter{id: []byte(idB), body: nil, dueMs: 2000}},
	}
	if err := g.storeDead(ctx, items); err != nil {
		t.Fatal(err)
	}
	if items[0].dead.entry != "1001:"+idA || items[1].dead.entry != "2000:"+idB {
		t.Fatalf("entries %q %q, want 1001:%s 2000:%s", items[0].dead.entry, items[1].dead.entry, idA, idB)
	}
	if s := rdb.ZScore(ctx, k.Dead(iA), "1001:"+idA).Val(); s != 1001 {
		t.Errorf("dead score %v", s)
	}
	if r := rdb.HGet(ctx, k.DeadReason(iA), "1001:"+idA).Val(); r != "ingress: r1" {
		t.Errorf("reason %q", r)
	}
	if b := rdb.HGet(ctx, k.ClaimedBody(iA), "1001:"+idA).Val(); b != "body-a" {
		t.Errorf("body %q", b)
	}
	if p := rdb.HGet(ctx, k.ClaimedProps(iA), "1001:"+idA).Val(); p != `{"routing_key":"x"}` {
		t.Errorf("props %q", p)
	}
	// An empty body is still a task id's body; no properties, none stored.
	if b, err := rdb.HGet(ctx, k.ClaimedBody(iB), "2000:"+idB).Result(); err != nil || b != "" {
		t.Errorf("empty body: %q %v", b, err)
	}
	if rdb.HExists(ctx, k.ClaimedProps(iB), "2000:"+idB).Val() {
		t.Error("properties stored for a dead letter without")
	}
	// The same message again: the same entry, written again.
	again := []item{{reason: "r2 again", dead: &deadLetter{id: []byte(idB), body: []byte("new"), dueMs: 2000}}}
	if err := g.storeDead(ctx, again); err != nil || again[0].dead.entry != "2000:"+idB {
		t.Fatalf("again: %v %q", err, again[0].dead.entry)
	}
	if n := rdb.ZCard(ctx, k.Dead(iB)).Val(); n != 1 {
		t.Errorf("%d dead letters after the same one twice", n)
	}
	// A wrong-type dead-letter key in shard a's: its dead letter is
	// refused, shard b's is written.
	rdb.Del(ctx, k.Dead(iA))
	rdb.Set(ctx, k.Dead(iA), "x", 0)
	items = []item{
		{reason: "r3", dead: &deadLetter{id: []byte(idA), dueMs: 3000}},
		{reason: "r4", dead: &deadLetter{id: []byte(idB), dueMs: 3000}},
	}
	if err := g.storeDead(ctx, items); err != nil {
		t.Fatal(err)
	}
	if items[0].dead.err == nil || !strings.Contains(items[0].dead.err.Error(), "WRONGTYPE") || items[0].dead.entry != "" {
		t.Errorf("wrong-type shard: err %v entry %q", items[0].dead.err, items[0].dead.entry)
	}
	if items[1].dead.err != nil || items[1].dead.entry != "3000:"+idB {
		t.Errorf("other shard: err %v entry %q", items[1].dead.err, items[1].dead.entry)
	}
	if rdb.HExists(ctx, k.DeadReason(iA), "3000:"+idA).Val() {
		t.Error("a refused dead letter left its reason behind")
	}
}

// TestRefused tells Redis refusing a write from Redis not answering.
func TestRefused(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{redis.ErrClosed, false},
		{errors.New("dial tcp: connection refused"), false},
		{proto("OOM command not allowed when used memory > 'maxmemory'."), true},
		{proto("WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{proto("NOPERM this user has no permissions"), true},
		{proto("LOADING Redis is loading the dataset in memory"), false},
		{proto("BUSY Redis is busy running a script"), false},
		{proto("READONLY You can't write against a read only replica."), false},
		{proto("CLUSTERDOWN The cluster is down"), false},
		{proto("ERR max number of clients reached"), false},
	} {
		if got := refused(c.err); got != c.want {
			t.Errorf("refused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// proto is an error reply of the server, as go-redis returns it.
type proto string

func (e proto) Error() string { return string(e) }
func (proto) RedisError()     {}
