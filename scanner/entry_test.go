package scanner

import (
	"bytes"
	"testing"
)

func TestParseEntry(t *testing.T) {
	for _, bad := range []string{"", ":m", "abc:m", "12"} {
		if _, err := ParseEntry(bad); err == nil {
			t.Errorf("ParseEntry(%q) accepted", bad)
		}
	}
	task, err := ParseEntry("-5:a:b")
	if err != nil || task.DueMs != -5 || string(task.Member) != "a:b" {
		t.Fatalf("%+v %v", task, err)
	}
}

// FuzzEntryRoundTrip: any member and due time survive the in-flight
// encoding unchanged.
func FuzzEntryRoundTrip(f *testing.F) {
	f.Add([]byte("order:42"), int64(1767225600000))
	f.Add([]byte{}, int64(0))
	f.Add([]byte{0, ':', 0xff}, int64(-1))
	f.Fuzz(func(t *testing.T, member []byte, due int64) {
		task, err := ParseEntry(EntryOf(member, due))
		if err != nil || task.DueMs != due || !bytes.Equal(task.Member, member) {
			t.Fatalf("round trip of %q@%d: %+v %v", member, due, task, err)
		}
	})
}
