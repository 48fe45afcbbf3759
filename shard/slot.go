package shard

import "strings"

// SlotCount is the number of hash slots of Redis Cluster.
const SlotCount = 16384

// crc16Table is the table of CRC16-CCITT (XMODEM: polynomial 0x1021,
// initial value 0, no reflection, no final xor), the checksum Redis
// Cluster hashes keys with.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crc16Table[byte(c>>8)^s[i]]
	}
	return c
}

// Slot is the Redis Cluster hash slot of key, as CLUSTER KEYSLOT computes
// it: CRC16 mod 16384 of the key's hash tag, the part between the first
// "{" and the first "}" after it, when that part is not empty; of the
// whole key otherwise.
func Slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % SlotCount)
}

// ShardSlot is the hash slot of every key of shard i (they all carry the
// hash tag {Q:i}).
func (k Keys) ShardSlot(i int) int { return Slot(k.Pending(i)) }
