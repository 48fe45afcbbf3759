package shard_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

func TestSlotVectors(t *testing.T) {
	for _, v := range []struct {
		key  string
		slot int
	}{
		{"foo", 12182}, // CLUSTER KEYSLOT foo, from the Redis docs
		{"", 0},
		{"123456789", 0x31c3 % shard.SlotCount}, // CRC16/XMODEM check value 0x31C3
		{"{user1000}.following", shard.Slot("user1000")},
		{"{user1000}.followers", shard.Slot("user1000")},
		{"foo{}{bar}", shard.Slot("foo{}{bar}")},  // empty tag: whole key
		{"foo{{bar}}zap", shard.Slot("{bar")},     // tag is "{bar"
		{"foo{bar}{zap}", shard.Slot("bar")},      // first tag only
		{"{bar", shard.Slot("{bar")},              // no closing brace
		{"}bar{", shard.Slot("}bar{")},            // "}" before "{" does not count
		{"dq:{orders:7}", shard.Slot("orders:7")}, // shard key
		{"dq:{orders:7}:inflight", shard.Slot("orders:7")},
	} {
		if got := shard.Slot(v.key); got != v.slot {
			t.Errorf("Slot(%q) = %d, want %d", v.key, got, v.slot)
		}
	}
	// Distinct vectors so the rules above are not vacuous.
	if shard.Slot("foo{}{bar}") == shard.Slot("bar") {
		t.Error("foo{}{bar} must hash the whole key, not bar")
	}
	if shard.Slot("foo{{bar}}zap") == shard.Slot("bar") {
		t.Error("foo{{bar}}zap must hash {bar, not bar")
	}
}

func TestShardSlot(t *testing.T) {
	k := shard.Keys{Prefix: shard.DefaultPrefix, Queue: "orders"}
	for i := range 64 {
		want := shard.Slot("orders:" + strconv.Itoa(i))
		if got := k.ShardSlot(i); got != want {
			t.Fatalf("ShardSlot(%d) = %d, want %d", i, got, want)
		}
		for _, key := range []string{k.Pending(i), k.Inflight(i), k.Attempts(i), k.Dead(i), k.DeadReason(i), k.LastClaim(i)} {
			if got := shard.Slot(key); got != want {
				t.Errorf("Slot(%q) = %d, want shard %d's slot %d", key, got, i, want)
			}
		}
	}
}

// slotTestKeys are keys whose slot the real server must agree on: random
// bytes, shard keys and keys with odd braces.
func slotTestKeys() []string {
	rng := rand.New(rand.NewPCG(1, 2))
	var keys []string
	for range 2000 {
		b := make([]byte, rng.IntN(40))
		for j := range b {
			if rng.IntN(8) == 0 {
				b[j] = "{}"[rng.IntN(2)] // make tags common
			} else {
				b[j] = byte(rng.Uint32())
			}
		}
		keys = append(keys, string(b))
	}
	for _, prefix := range []string{"dq", "", "x:y", "dq{", "a}b"} {
		for _, q := range []string{"default", "orders", "q", "a.b-c_d", strings.Repeat("z", 64)} {
			k := shard.Keys{Prefix: prefix, Queue: q}
			for i := 0; i < 4096; i += 1 + i/8 {
				keys = append(keys, k.Pending(i), k.Dead(i), k.Counter())
			}
		}
	}
	keys = append(keys, "{}", "{}}", "{{}}", "}{", "{", "}", "a{b}c{d}e", "{a}{b}", "{{", "}}{a}",
		"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{user1000}.following", "задача{задача}", "\x00{\xff}")
	return keys
}

// TestSlotMatchesRedis compares Slot with CLUSTER KEYSLOT of a real
// cluster-enabled redis-server (a lone node answers it without slots).
func TestSlotMatchesRedis(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{
		"cluster-enabled yes",
		"cluster-config-file " + filepath.Join(t.TempDir(), "nodes.conf"),
	}})
	rdb := srv.Client()
	ctx := context.Background()
	keys := slotTestKeys()
	cmds := make([]*redis.IntCmd, len(keys))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, key := range keys {
			cmds[i] = p.ClusterKeySlot(ctx, key)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, key := range keys {
		want, err := cmds[i].Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
		}
		if got := shard.Slot(key); got != int(want) {
			bad++
			if bad <= 10 {
				t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d keys disagree", bad, len(keys))
	}
	t.Logf("%d keys agree with CLUSTER KEYSLOT", len(keys))
}
