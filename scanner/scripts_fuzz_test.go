package scanner

import (
	"bytes"
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// FuzzScriptsCarryAnyMember runs any member bytes and any due time in the
// past through the scripts on real Redis: claimed with its due time (the
// score's integer part), handed back (released, or put back into pending
// by unclaim), dead-lettered or confirmed per op, it comes out byte for
// byte, and afterwards nothing is left but its dead record, if it died.
// Per op the member is a plain one or an id, scheduled as the contract
// says with a body, properties or both (made of the member's bytes): every
// claim returns exactly those, they live under the entry while it is in
// flight or dead and under the id while it is pending, and an ack leaves
// none behind.
func FuzzScriptsCarryAnyMember(f *testing.F) {
	for _, seed := range []struct {
		member []byte
		ago    float64
		op     uint8
	}{
		{[]byte("order:42"), 1000, 0}, {nil, 0.5, 1}, {[]byte("a:b:c"), 1e12, 2},
		{[]byte("\x00\xff\n{bin}:"), 3.75, 3}, {[]byte("return redis.call('FLUSHALL')"), 10, 2},
		{[]byte("1767225600000:x"), 7, 1}, {[]byte("id:7"), 5, 4 | 0}, {nil, 2, 12 | 1},
		{[]byte("id\x00"), 9, 8 | 2}, {[]byte("x"), 3, 16 | 4 | 1}, {[]byte("y"), 3, 16 | 12 | 1}, {[]byte("z"), 4, 12 | 3},
	} {
		f.Add(seed.member, seed.ago, seed.op)
	}
	rdb := testenv.Redis(f)
	k := shard.Keys{Prefix: testenv.Name(f), Queue: "q"}
	testenv.CleanRedis(f, rdb, k.Prefix)
	st := &store{rdb: rdb, keys: k, lease: 30 * time.Second, retryMin: time.Millisecond,
		retryMax: time.Millisecond, maxAttempts: 1, instance: "fuzz"}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, member []byte, ago float64, op uint8) {
		if math.IsNaN(ago) || ago < 0 || ago > 1e12 {
			return // only due tasks are claimed; the claim tests cover the rest
		}
		all := []string{k.Pending(0), k.Inflight(0), k.Attempts(0), k.Dead(0), k.DeadReason(0), k.LastClaim(0),
			k.Tasks(0), k.Props(0), k.ClaimedBody(0), k.ClaimedProps(0)}
		if err := rdb.Del(ctx, all...).Err(); err != nil {
			t.Fatal(err)
		}
		// op>>2&3: 1 an id with a body, 2 a member with properties, 3 both.
		var body, props any
		if op>>2&1 == 1 {
			body = string(bytes.Repeat(member, 2)) // empty for an empty id: still a body
		}
		if op>>3&1 == 1 {
			props = `{"correlation_id":"` + string(member) + `"}`
		}
		score := float64(serverMs(t, rdb)) - ago
		if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if body != nil {
				p.HSet(ctx, k.Tasks(0), member, body)
			}
			if props != nil {
				p.HSet(ctx, k.Props(0), member, props)
			}
			p.ZAdd(ctx, k.Pending(0), redis.Z{Score: score, Member: member})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		stored := rdb.ZScore(ctx, k.Pending(0), string(member)).Val() // as Redis keeps it
		want := EntryOf(member, int64(math.Floor(stored)))
		// where checks that body and props are under the entry in the
		// claimed hashes (claimed) or under the id in :tasks and :props.
		where := func(what string, claimed bool) {
			t.Helper()
			for _, h := range []struct {
				pending, claimed string
				want             any
			}{{k.Tasks(0), k.ClaimedBody(0), body}, {k.Props(0), k.ClaimedProps(0), props}} {
				at, field, other := h.pending, string(member), h.claimed
				if claimed {
					at, field, other = h.claimed, want, h.pending
				}
				v, err := rdb.HGet(ctx, at, field).Result()
				switch {
				case h.want == nil && err != redis.Nil:
					t.Fatalf("%s: %s field %q is %q (%v), want none", what, at, field, v, err)
				case h.want != nil && (err != nil || v != h.want):
					t.Fatalf("%s: %s field %q is %q (%v), want %q", what, at, field, v, err, h.want)
				}
				if n := rdb.Exists(ctx, other).Val(); n != 0 {
					t.Fatalf("%s: %s exists, want only %s", what, other, at)
				}
			}
		}
		// got checks what a claim returned for the task.
		got := func(what string, c claimed) {
			t.Helper()
			if len(c.entries) != 1 || c.bodies[0] != body || c.props[0] != props {
				t.Fatalf("%s returned body %q and properties %q, want %q and %q", what, c.bodies, c.props, body, props)
			}
		}
		c, err := st.claim(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.entries) != 1 || c.entries[0] != want {
			t.Fatalf("claimed %q, want %q", c.entries, want)
		}
		task, err := ParseEntry(c.entries[0])
		if err != nil || !bytes.Equal(task.Member, member) {
			t.Fatalf("entry %q parses to %+v, %v", c.entries[0], task, err)
		}
		got("claim", c)
		where("claimed", true)
		switch op % 4 {
		case 1: // handed back, then claimed again
			if op>>4&1 == 1 {
				if back, _, err := st.unclaim(ctx, 0, c.deadline, c.entries); err != nil || back != 1 {
					t.Fatalf("unclaim: %d, %v", back, err)
				}
				where("put back into pending", false)
			} else if n, err := st.release(ctx, 0, c.deadline, c.entries); err != nil || n != 1 {
				t.Fatalf("release: %d, %v", n, err)
			}
			if c, err = st.claim(ctx, 0, 10); err != nil || len(c.entries) != 1 || c.entries[0] != want {
				t.Fatalf("claim after release: %q, %v", c.entries, err)
			}
			got("claim after release", c)
		case 2: // dead at once
			if _, dead, err := st.fail(ctx, 0, c.deadline, []outcome{{want, "dead", "fuzz"}}); err != nil || dead != 1 {
				t.Fatalf("dead-letter: %d, %v", dead, err)
			}
			if s, err := rdb.ZScore(ctx, k.Dead(0), want).Result(); err != nil || int64(s) != task.DueMs {
				t.Fatalf("dead record: %v, %v", s, err)
			}
			if rdb.HGet(ctx, k.DeadReason(0), want).Val() != "fuzz (after 1 attempts)" {
				t.Fatal("dead reason missing")
			}
			where("dead", true) // a dead letter keeps body and properties
			rdb.Del(ctx, k.Dead(0), k.DeadReason(0), k.ClaimedBody(0), k.ClaimedProps(0))
		case 3: // a retry, then taken over when its backoff runs out
			if retried, _, err := st.fail(ctx, 0, c.deadline, []outcome{{want, "retry", "fuzz"}}); err != nil || retried != 1 {
				t.Fatalf("retry: %d, %v", retried, err)
			}
			for end := time.Now().Add(time.Second); ; time.Sleep(2 * time.Millisecond) {
				if c, err = st.claim(ctx, 0, 10); err != nil || len(c.entries) == 1 || time.Now().After(end) {
					break
				}
			}
			if err != nil || len(c.entries) != 1 || c.entries[0] != want {
				t.Fatalf("retried entry not taken over: %q, %v", c.entries, err)
			}
			got("claim of the retry", c)
		}
		if op%4 != 2 {
			if n, err := st.ack(ctx, 0, []string{want}); err != nil || n != 1 {
				t.Fatalf("ack: %d, %v", n, err)
			}
		}
		if n := rdb.Exists(ctx, slices.DeleteFunc(all, func(key string) bool { return key == k.LastClaim(0) })...).Val(); n != 0 {
			t.Fatalf("%d keys left behind", n)
		}
	})
}
