package scanner

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// FuzzScriptsCarryAnyMember runs any member bytes and any due time in the
// past through the scripts on real Redis: claimed with its due time (the
// score's integer part), handed back, dead-lettered or confirmed per op,
// it comes out byte for byte, and afterwards nothing is left but its dead
// record, if it died.
func FuzzScriptsCarryAnyMember(f *testing.F) {
	for _, seed := range []struct {
		member []byte
		ago    float64
		op     uint8
	}{
		{[]byte("order:42"), 1000, 0}, {nil, 0.5, 1}, {[]byte("a:b:c"), 1e12, 2},
		{[]byte("\x00\xff\n{bin}:"), 3.75, 3}, {[]byte("return redis.call('FLUSHALL')"), 10, 2},
		{[]byte("1767225600000:x"), 7, 1},
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
		if err := rdb.Del(ctx, k.Pending(0), k.Inflight(0), k.Attempts(0), k.Dead(0), k.DeadReason(0), k.LastClaim(0)).Err(); err != nil {
			t.Fatal(err)
		}
		score := float64(serverMs(t, rdb)) - ago
		if err := rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: score, Member: member}).Err(); err != nil {
			t.Fatal(err)
		}
		stored := rdb.ZScore(ctx, k.Pending(0), string(member)).Val() // as Redis keeps it
		want := EntryOf(member, int64(math.Floor(stored)))
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
		switch op % 4 {
		case 1: // handed back, then claimed again
			if n, err := st.release(ctx, 0, c.deadline, c.entries); err != nil || n != 1 {
				t.Fatalf("release: %d, %v", n, err)
			}
			if c, err = st.claim(ctx, 0, 10); err != nil || len(c.entries) != 1 || c.entries[0] != want {
				t.Fatalf("claim after release: %q, %v", c.entries, err)
			}
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
			rdb.Del(ctx, k.Dead(0), k.DeadReason(0))
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
		}
		if op%4 != 2 {
			if n, err := st.ack(ctx, 0, []string{want}); err != nil || n != 1 {
				t.Fatalf("ack: %d, %v", n, err)
			}
		}
		if n := rdb.Exists(ctx, k.Pending(0), k.Inflight(0), k.Attempts(0), k.Dead(0), k.DeadReason(0)).Val(); n != 0 {
			t.Fatalf("%d keys left behind", n)
		}
	})
}
