package recurring

import (
	"strings"
	"testing"
)

func TestParseFile(t *testing.T) {
	f, err := ParseFile([]byte(`{"schedules": [{"queue": "q", "name": "a", "cron": "0 9 * * *", "tz": "Europe/Berlin", "body": "{\"x\":1}", "catchup": "all", "grace": "1m"}]}`))
	if err != nil || len(f.Schedules) != 1 || f.Schedules[0].Body != `{"x":1}` {
		t.Fatalf("%+v %v", f, err)
	}
	// Properties are an object in the file, kept as written (compacted);
	// a bad one is refused by Parse, naming the schedule and the field.
	f, err = ParseFile([]byte(`{"schedules": [
	  {"queue": "q", "name": "a", "cron": "@daily", "body": "b", "properties": {"headers": {"tenant": "acme"}, "priority": 3}},
	  {"queue": "q", "name": "bad", "cron": "@daily", "body": "c", "properties": {"priority": "high"}}]}`))
	if err != nil || len(f.Schedules) != 2 || f.Schedules[0].Properties != `{"headers":{"tenant":"acme"},"priority":3}` {
		t.Fatalf("%+v %v", f, err)
	}
	if _, err := Parse(f.Schedules[0]); err != nil {
		t.Errorf("schedule with properties: %v", err)
	}
	if _, err := Parse(f.Schedules[1]); err == nil || !strings.Contains(err.Error(), `q/bad: properties: field "priority"`) {
		t.Errorf("schedule with a bad priority: %v", err)
	}
	for _, bad := range []string{
		`{"schedules": [{"queue": "q", "name": "a", "crom": "0 9 * * *"}]}`, // a typo is an error
		`{"schedules": [{"queue": "q", "name": "a", "cron": "@daily", "paused": true}]}`,
		`schedules: []`,
	} {
		if _, err := ParseFile([]byte(bad)); err == nil {
			t.Errorf("ParseFile(%s) accepted", bad)
		}
	}
}

// FuzzParseFile: whatever an operator writes, parsing it and its
// schedules returns an error or a schedule whose next occurrences
// increase, never a panic.
func FuzzParseFile(f *testing.F) {
	f.Add(`{"schedules": [{"queue": "q", "name": "a", "cron": "30 2 * * *", "tz": "Europe/Berlin", "body": "b"}]}`)
	f.Add(`{"schedules": [{"queue": "q", "name": "a", "cron": "@every 90s", "body": "b", "catchup": "skip"}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		file, err := ParseFile([]byte(s))
		if err != nil {
			return
		}
		for _, d := range file.Schedules {
			sc, err := Parse(d)
			if err != nil {
				if !strings.Contains(err.Error(), d.Name) {
					t.Errorf("error %q does not name %q", err, d.Name)
				}
				continue
			}
			prev := utc("2026-03-01T00:00:00Z")
			for range 3 {
				n := sc.NextAfter(prev)
				if n.IsZero() {
					break
				}
				if !n.After(prev) {
					t.Fatalf("%+v: %s after %s", d, n, prev)
				}
				prev = n
			}
		}
	})
}
