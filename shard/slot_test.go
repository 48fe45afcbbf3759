package shard_test

import (
	"strconv"
	"testing"

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
