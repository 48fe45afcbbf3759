package shard_test

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/shard"
)

// xxh64 is XXH64 with seed 0 written from the algorithm's specification
// (github.com/Cyan4973/xxHash, doc/xxhash_spec.md), independent of the
// library the package uses, so the fuzz test below checks the package
// against the contract rather than against itself.
func xxh64(b []byte) uint64 {
	// Variables, not constants: the algorithm relies on wrapping arithmetic,
	// which Go's constant expressions reject.
	var (
		p1 uint64 = 0x9E3779B185EBCA87
		p2 uint64 = 0xC2B2AE3D27D4EB4F
		p3 uint64 = 0x165667B19E3779F9
		p4 uint64 = 0x85EBCA77C2B2AE63
		p5 uint64 = 0x27D4EB2F165667C5
	)
	round := func(acc, in uint64) uint64 { return bits.RotateLeft64(acc+in*p2, 31) * p1 }
	merge := func(acc, v uint64) uint64 { return (acc^round(0, v))*p1 + p4 }
	n := uint64(len(b))
	var h uint64
	if len(b) >= 32 {
		v1, v2, v3, v4 := p1+p2, p2, uint64(0), -p1
		for ; len(b) >= 32; b = b[32:] {
			v1 = round(v1, binary.LittleEndian.Uint64(b))
			v2 = round(v2, binary.LittleEndian.Uint64(b[8:]))
			v3 = round(v3, binary.LittleEndian.Uint64(b[16:]))
			v4 = round(v4, binary.LittleEndian.Uint64(b[24:]))
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = merge(merge(merge(merge(h, v1), v2), v3), v4)
	} else {
		h = p5
	}
	h += n
	for ; len(b) >= 8; b = b[8:] {
		h = bits.RotateLeft64(h^round(0, binary.LittleEndian.Uint64(b)), 27)*p1 + p4
	}
	if len(b) >= 4 {
		h = bits.RotateLeft64(h^uint64(binary.LittleEndian.Uint32(b))*p1, 23)*p2 + p3
		b = b[4:]
	}
	for _, c := range b {
		h = bits.RotateLeft64(h^uint64(c)*p5, 11) * p1
	}
	h ^= h >> 33
	h *= p2
	h ^= h >> 29
	h *= p3
	h ^= h >> 32
	return h
}

// The reference itself must give the contract's vectors, or the fuzz test
// proves nothing.
func TestReferenceXXH64(t *testing.T) {
	for _, v := range vectors {
		if got := fmt.Sprintf("%016x", xxh64([]byte(v.member))); got != v.hash {
			t.Errorf("reference xxh64(%q) = %s, want %s", v.member, got, v.hash)
		}
	}
}

var messageIDRE = regexp.MustCompile(`^([0-9a-f]{16})-(-?[0-9]+)$`)

// FuzzMemberContract: for any member bytes, shard count 1..MaxShards and
// due time, Hash is XXH64 seed 0, Index is the unsigned hash mod M, the
// member's key is P:{Q:i}, and MessageID is 16 lowercase hex digits of the
// hash, "-", the due time.
func FuzzMemberContract(f *testing.F) {
	for _, v := range vectors {
		f.Add([]byte(v.member), uint16(16), int64(1767225600000))
	}
	f.Add([]byte{0, 0xff, ':', '{', '}'}, uint16(4096), int64(-1))
	f.Add([]byte(strings.Repeat("x", 33)), uint16(1), int64(0))
	f.Add([]byte(strings.Repeat("\x80", 71)), uint16(4095), int64(-9223372036854775808))
	f.Fuzz(func(t *testing.T, member []byte, m uint16, due int64) {
		shards := int(m)%shard.MaxShards + 1
		want := xxh64(member)
		if got := shard.Hash(member); got != want {
			t.Fatalf("Hash(%q) = %016x, want %016x", member, got, want)
		}
		i := shard.Index(member, shards)
		if i < 0 || i >= shards || uint64(i) != want%uint64(shards) {
			t.Fatalf("Index(%q, %d) = %d, want %d", member, shards, i, want%uint64(shards))
		}
		k := shard.Keys{Prefix: "dq", Queue: "orders"}
		if got, wantKey := k.Shard(member, shards), "dq:{orders:"+strconv.Itoa(i)+"}"; got != wantKey {
			t.Fatalf("Shard key %q, want %q", got, wantKey)
		}
		id := shard.MessageID(member, due)
		sub := messageIDRE.FindStringSubmatch(id)
		if sub == nil {
			t.Fatalf("MessageID(%q, %d) = %q: not the contract's form", member, due, id)
		}
		if h, _ := strconv.ParseUint(sub[1], 16, 64); h != want {
			t.Fatalf("MessageID(%q, %d) = %q: hash part is not XXH64", member, due, id)
		}
		if d, err := strconv.ParseInt(sub[2], 10, 64); err != nil || d != due {
			t.Fatalf("MessageID(%q, %d) = %q: due part %v", member, due, id, err)
		}
	})
}
