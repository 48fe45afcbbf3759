package scanner

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseEntry: any string read back from an in-flight set (which anyone
// with access to Redis can write) parses without panicking; when it
// parses, the member is everything after the first ':' and the entry
// re-encodes to the same due time and member.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{"1767225600000:order:42", "", ":", "-9223372036854775808:x", "9223372036854775808:x", "+5:x", "007:", "1e3:x", "\x00:\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, e string) {
		task, err := ParseEntry(e)
		if err != nil {
			return
		}
		_, member, ok := strings.Cut(e, ":")
		if !ok || !bytes.Equal(task.Member, []byte(member)) || task.Entry != e {
			t.Fatalf("ParseEntry(%q) = %+v", e, task)
		}
		again, err := ParseEntry(EntryOf(task.Member, task.DueMs))
		if err != nil || again.DueMs != task.DueMs || !bytes.Equal(again.Member, task.Member) {
			t.Fatalf("re-encoded %q: %+v %v", e, again, err)
		}
	})
}
