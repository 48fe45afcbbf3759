package bench

import "strconv"

// A bench task's member is its index in decimal, ':', then padding up to
// the message size: distinct for every task, and the consumer reads the
// index back to find duplicates and missing tasks without a map.

// member returns task i's member of size bytes.
func member(buf []byte, i, size int) []byte {
	buf = strconv.AppendInt(buf[:0], int64(i), 10)
	buf = append(buf, ':')
	for len(buf) < size {
		buf = append(buf, 'x')
	}
	return buf
}

// memberIndex reads the task index back from a body; ok is false for a
// body the bench did not write.
func memberIndex(body []byte) (int, bool) {
	n := 0
	for i, c := range body {
		switch {
		case c == ':' && i > 0:
			return n, true
		case c >= '0' && c <= '9' && i < 10:
			n = n*10 + int(c-'0')
		default:
			return 0, false
		}
	}
	return 0, false
}
