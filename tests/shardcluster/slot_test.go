package shardcluster_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

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
