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

// With -ids a task is scheduled by id, as the contract's tasks with an id
// are: its id is "t" and its index (short, as ids usually are), its body
// the member above, which still carries the index for the consumer.

// taskID returns task i's id.
func taskID(buf []byte, i int) []byte {
	buf = append(buf[:0], 't')
	return strconv.AppendInt(buf, int64(i), 10)
}

// traceID appends task i's W3C trace id: a fixed half, then the index in
// hex, so that the consumer can check that each task's own properties
// reached it. A tracer in the dispatcher may replace the parent id, never
// the trace id.
func traceID(buf []byte, i int) []byte {
	buf = append(buf, "0af7651916cd43dd"...)
	const hex = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		buf = append(buf, hex[(uint64(i)>>shift)&0xf])
	}
	return buf
}

// taskProps returns task i's properties with -props: a traceparent
// header, as a traced producer sets (85 bytes).
func taskProps(buf []byte, i int) []byte {
	buf = append(buf[:0], `{"headers":{"traceparent":"00-`...)
	buf = traceID(buf, i)
	return append(buf, `-b7ad6b7169203331-01"}}`...)
}

// traceIDOf is the trace id of a traceparent header, or "".
func traceIDOf(traceparent string) string {
	if len(traceparent) < 35 || traceparent[2] != '-' {
		return ""
	}
	return traceparent[3:35]
}
