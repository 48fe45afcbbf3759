package scanner

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// claimAsOwner runs the claim script recording owner as the claim's holder.
func claimAsOwner(t *testing.T, rdb *redis.Client, k shard.Keys, limit int, owner string) []any {
	t.Helper()
	keys := append(claimKeysOf(k, 0), k.Owners(0))
	v, err := claimScript.Run(context.Background(), rdb, keys, limit, 60000, claimTokens.Add(1), 0, 0, owner).Slice()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func handBack(t *testing.T, rdb *redis.Client, k shard.Keys, owner string) int {
	t.Helper()
	n, err := handBackScript.Run(context.Background(), rdb, []string{k.Inflight(0), k.Owners(0)}, owner).Int()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHandBackOnlyTheDeadOwnersClaims: the hand-back of a dead instance
// gives lease 0 to the entries its claims still hold, and to no other
// instance's, nor to one of its entries whose lease changed meanwhile; a
// second run finds nothing.
func TestHandBackOnlyTheDeadOwnersClaims(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	for n, m := range []string{"a", "b", "c", "d", "e"} {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 100 + int64(n)), Member: m})
	}
	a := claimAsOwner(t, rdb, k, 2, "A#0")
	b := claimAsOwner(t, rdb, k, 2, "B#0")
	a2 := claimAsOwner(t, rdb, k, 1, "A#0")
	if len(entriesOf(a)) != 2 || len(entriesOf(b)) != 2 || len(entriesOf(a2)) != 1 {
		t.Fatalf("claims took %d, %d, %d entries, want 2, 2, 1", len(entriesOf(a)), len(entriesOf(b)), len(entriesOf(a2)))
	}
	owners, err := rdb.ZRange(ctx, k.Owners(0), 0, -1).Result()
	if err != nil || len(owners) != 3 {
		t.Fatalf("owners %v (%v), want 3 records", owners, err)
	}
	// A's second claim's entry was re-leased meanwhile (say a retry): not A's.
	e := entriesOf(a2)[0].(string)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now + 99999), Member: e})

	if n := handBack(t, rdb, k, "A#0"); n != 2 {
		t.Fatalf("hand-back of A gave out %d entries, want 2", n)
	}
	for _, x := range entriesOf(a) {
		if s := rdb.ZScore(ctx, k.Inflight(0), x.(string)).Val(); s != 0 {
			t.Errorf("A's entry %v has lease %v after the hand-back, want 0", x, s)
		}
	}
	bDeadline := b[4].(string)
	for _, x := range entriesOf(b) {
		if s := rdb.ZScore(ctx, k.Inflight(0), x.(string)).Val(); s == 0 || strconv.FormatInt(int64(s), 10) != bDeadline {
			t.Errorf("B's entry %v has lease %v after A's hand-back, want its claim's %s", x, s, bDeadline)
		}
	}
	if s := rdb.ZScore(ctx, k.Inflight(0), e).Val(); s != float64(now+99999) {
		t.Errorf("re-leased entry %s has lease %v, want it left alone", e, s)
	}
	if n := handBack(t, rdb, k, "A#0"); n != 0 {
		t.Errorf("second hand-back gave out %d, want 0", n)
	}
	// The entries handed out are claimed again at once, by anyone.
	c := claimAsOwner(t, rdb, k, 10, "B#0")
	if got := len(entriesOf(c)); got != 2 {
		t.Errorf("claim after the hand-back took %d entries, want A's 2", got)
	}
}

// TestClaimOwnersWrongTypeChangesNothing: an owners key of the wrong type
// fails the claim with nothing changed.
func TestClaimOwnersWrongTypeChangesNothing(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 1, Member: "a"})
	rdb.Set(ctx, k.Owners(0), "x", 0)
	before := snapshot(t, rdb, k.Prefix)
	keys := append(claimKeysOf(k, 0), k.Owners(0))
	err := claimScript.Run(ctx, rdb, keys, 10, 60000, claimTokens.Add(1), 0, 0, "A#0").Err()
	if err == nil || !redis.HasErrorPrefix(err, "WRONGTYPE") {
		t.Fatalf("claim with a string owners key: %v, want WRONGTYPE", err)
	}
	after := snapshot(t, rdb, k.Prefix)
	if len(before) != len(after) {
		t.Fatalf("keys changed: %v -> %v", before, after)
	}
	for key, v := range before {
		if after[key] != v {
			t.Errorf("%s changed: %q -> %q", key, v, after[key])
		}
	}
}
