package shard_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/shard"
)

// The contract's XXH64 test vectors: seed 0, hash in hex, then mod 16.
var vectors = []struct {
	member string
	hash   string
	mod16  int
}{
	{"", "ef46db3751d8e999", 9},
	{"a", "d24ec4f1a98c6e5b", 11},
	{"order:42", "aa1f6214e0a40ff4", 4},
	{`{"id":1}`, "b7885ee991dfe823", 3},
	{"задача", "2cc77690f6f15f7a", 10},
}

func TestHashVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(fmt.Sprintf("%q", v.member), func(t *testing.T) {
			if got := fmt.Sprintf("%016x", shard.Hash([]byte(v.member))); got != v.hash {
				t.Errorf("Hash(%q) = %s, want %s", v.member, got, v.hash)
			}
			if got := shard.Index([]byte(v.member), 16); got != v.mod16 {
				t.Errorf("Index(%q, 16) = %d, want %d", v.member, got, v.mod16)
			}
		})
	}
}

// The hash is read as unsigned: a member whose hash has the top bit set
// must still land in [0, m) and agree with the unsigned remainder.
func TestIndexUnsigned(t *testing.T) {
	seenHigh := false
	for i := 0; i < 1000; i++ {
		m := []byte(fmt.Sprintf("task:%d", i))
		h := shard.Hash(m)
		if h>>63 == 1 {
			seenHigh = true
		}
		for _, n := range []int{1, 3, 7, 16, 1000, shard.MaxShards} {
			got := shard.Index(m, n)
			if got < 0 || got >= n || uint64(got) != h%uint64(n) {
				t.Fatalf("Index(%q, %d) = %d, want %d", m, n, got, h%uint64(n))
			}
		}
	}
	if !seenHigh {
		t.Fatal("no member with the top hash bit set; widen the sample")
	}
	if got := shard.Index([]byte("order:42"), 1); got != 0 {
		t.Errorf("Index(order:42, 1) = %d, want 0", got)
	}
}

func TestKeys(t *testing.T) {
	k := shard.Keys{Prefix: "dq", Queue: "orders"}
	if got, want := k.Pending(7), "dq:{orders:7}"; got != want {
		t.Errorf("Pending(7) = %q, want %q", got, want)
	}
	if got, want := k.Pending(0), "dq:{orders:0}"; got != want {
		t.Errorf("Pending(0) = %q, want %q", got, want)
	}
	if got, want := (shard.Keys{Prefix: "tasks", Queue: "mail.out-2"}).Pending(4095), "tasks:{mail.out-2:4095}"; got != want {
		t.Errorf("Pending(4095) = %q, want %q", got, want)
	}
	// order:42 is in shard 4 of 16.
	if got, want := k.Shard([]byte("order:42"), 16), "dq:{orders:4}"; got != want {
		t.Errorf("Shard(order:42, 16) = %q, want %q", got, want)
	}

	keys := map[string]string{
		"Pending":    k.Pending(7),
		"Inflight":   k.Inflight(7),
		"Attempts":   k.Attempts(7),
		"Retrying":   k.Retrying(7),
		"Dead":       k.Dead(7),
		"DeadReason": k.DeadReason(7),
		"LastClaim":  k.LastClaim(7),
	}
	distinct := map[string]string{}
	for name, key := range keys {
		if tag := hashTag(key); tag != "orders:7" {
			t.Errorf("%s(7) = %q has hash tag %q, want %q", name, key, tag, "orders:7")
		}
		if !strings.HasPrefix(key, "dq:") {
			t.Errorf("%s(7) = %q does not start with the prefix", name, key)
		}
		if other, dup := distinct[key]; dup {
			t.Errorf("%s and %s are both %q", name, other, key)
		}
		distinct[key] = name
	}
	// The queue-wide keys must not collide with a shard's keys.
	for _, key := range []string{k.Counter(), k.ShardCount()} {
		if _, dup := distinct[key]; dup {
			t.Errorf("queue-wide key %q collides", key)
		}
		if !strings.HasPrefix(key, "dq:") {
			t.Errorf("queue-wide key %q does not start with the prefix", key)
		}
	}
	if k.Counter() == k.ShardCount() {
		t.Errorf("Counter and ShardCount are both %q", k.Counter())
	}
}

// hashTag is the part of key Redis Cluster hashes: between the first '{'
// and the first '}' after it, if not empty.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}

func TestMessageID(t *testing.T) {
	if got, want := shard.MessageID([]byte("order:42"), 1767225600000), "aa1f6214e0a40ff4-1767225600000"; got != want {
		t.Errorf("MessageID = %q, want %q", got, want)
	}
	if got, want := shard.MessageID(nil, 0), "ef46db3751d8e999-0"; got != want {
		t.Errorf("MessageID(empty, 0) = %q, want %q", got, want)
	}
	// The hex part is always 16 lowercase digits, leading zeros kept.
	re := regexp.MustCompile(`^[0-9a-f]{16}-[0-9]+$`)
	var small []byte
	for i := 0; i < 1<<20 && small == nil; i++ {
		m := []byte(fmt.Sprintf("m%d", i))
		if shard.Hash(m) < 1<<60 {
			small = m
		}
	}
	if small == nil {
		t.Fatal("found no member with a hash below 1<<60")
	}
	id := shard.MessageID(small, 1767225600000)
	if !re.MatchString(id) || id[0] != '0' {
		t.Errorf("MessageID(%q) = %q, want 16 lowercase hex digits with a leading 0", small, id)
	}
	for _, v := range vectors {
		id := shard.MessageID([]byte(v.member), 42)
		if id != v.hash+"-42" || !re.MatchString(id) {
			t.Errorf("MessageID(%q, 42) = %q, want %q", v.member, id, v.hash+"-42")
		}
	}
	if shard.DueMs(time.UnixMilli(1767225600123).Add(999*time.Microsecond)) != 1767225600123 {
		t.Error("DueMs does not return milliseconds since the epoch")
	}
}

func TestValidQueueName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"orders", true},
		{"a", true},
		{"Z", true},
		{"0", true},
		{"mail.out-2", true},
		{"A_Z.a-z_0-9", true},
		{"...", true},
		{"-", true},
		{strings.Repeat("q", 64), true},
		{"", false},
		{strings.Repeat("q", 65), false},
		{"or ders", false},
		{"a:b", false},
		{"{orders}", false},
		{"a}b", false},
		{"a/b", false},
		{"a,b", false},
		{"a*", false},
		{"orders\n", false},
		{"\norders", false},
		{"orders\x00", false},
		{"задача", false},
		{"é", false},
		{" orders", false},
	}
	for _, tt := range tests {
		if got := shard.ValidQueueName(tt.name); got != tt.ok {
			t.Errorf("ValidQueueName(%q) = %v, want %v", tt.name, got, tt.ok)
		}
	}
}

// TestPendingRange: the keys of a range are Pending's, one by one.
func TestPendingRange(t *testing.T) {
	k := shard.Keys{Prefix: "dq", Queue: "orders"}
	for _, r := range [][2]int{{0, 0}, {5, 4}, {0, 1}, {9, 12}, {16, 356}, {4000, shard.MaxShards}} {
		got := k.PendingRange(r[0], r[1])
		if want := max(r[1]-r[0], 0); len(got) != want {
			t.Fatalf("PendingRange(%d, %d): %d keys, want %d", r[0], r[1], len(got), want)
		}
		for n, key := range got {
			if want := k.Pending(r[0] + n); key != want {
				t.Fatalf("PendingRange(%d, %d)[%d] = %q, want %q", r[0], r[1], n, key, want)
			}
		}
	}
}
