package scanner

import (
	"bytes"

	"fmt"
	"github.com/dispatcher/dispatcher/shard"
	"math"
	"strconv"
)

// Task is one claimed scheduling.
type Task struct {
	Entry  string // the in-flight entry, "<due_ms>:<member>"
	Member []byte
	DueMs  int64
	// HasID: the member is an id, scheduled with a body of its own (Body).
	HasID bool
	Body  []byte
	// Props is the task's properties JSON as stored; nil: none.
	Props []byte
	props *shard.Properties // Props, parsed and valid (dispatch)
}

// withStored sets what the claim read of the task's stored body and
// properties (a string, or nil for none).
func (t *Task) withStored(body, props any) {
	if b, ok := body.(string); ok {
		t.HasID, t.Body = true, []byte(b)
	}
	if p, ok := props.(string); ok {
		t.Props = []byte(p)
	}
}

// Payload is the message body: the stored body of an id, else the member.
func (t *Task) Payload() []byte {
	if t.HasID {
		return t.Body
	}
	return t.Member
}

// batch is what one claim took from one shard.
type batch struct {
	shard    int
	deadline int64 // the lease all its tasks are claimed under (server ms)
	tasks    []Task
	reserved int    // room in the holder reserved for it, freed once its tasks are held
	nowUs    int64  // the Redis clock when it was claimed, µs (0: not known)
	owner    string // the liveness id it was claimed under ("": none)
}

// ParseEntry splits an in-flight entry into due time and member.
func ParseEntry(e string) (Task, error) {
	b := []byte(e)
	i := bytes.IndexByte(b, ':')
	if i <= 0 {
		return Task{}, fmt.Errorf("in-flight entry %.40q: no due time", e)
	}
	due, err := strconv.ParseInt(e[:i], 10, 64)
	if err != nil {
		return Task{}, fmt.Errorf("in-flight entry %.40q: due time: %w", e, err)
	}
	return Task{Entry: e, Member: b[i+1:], DueMs: due}, nil
}

// EntryOf is the in-flight entry of a member due at dueMs.
func EntryOf(member []byte, dueMs int64) string {
	return strconv.FormatInt(dueMs, 10) + ":" + string(member)
}

// parseScore reads a score the scripts return as a string; "" means none.
// A fraction rounds up: a score is due once the server's whole-ms clock
// has reached it (a retry's lease ends in half a ms).
func parseScore(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok || s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	switch {
	case f > 1<<62:
		return 1 << 62, true
	case f < -(1 << 62):
		return -(1 << 62), true
	}
	return int64(math.Ceil(f)), true
}
