package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/shard"
)

// TestStatsSummary: more than 8 shards in all make a row per queue by
// default, saying so; --shards shows every shard, --summary leaves them
// out at any count; the broken shards are named in the notes either way.
func TestStatsSummary(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "small", 4)
	recordShards(t, rdb, prefix, "big", 12)
	k := shard.Keys{Prefix: prefix, Queue: "big"}
	for _, i := range []int{3, 5} {
		rdb.Set(context.Background(), k.Pending(i), "not a sorted set", 0)
	}
	rowsOf := func(out, queue string) []string {
		var rows []string
		for _, m := range regexp.MustCompile(`(?m)^\s*`+queue+`\s+(\S+)\s`).FindAllStringSubmatch(out, -1) {
			rows = append(rows, m[1])
		}
		return rows
	}
	tests := []struct {
		args       []string
		small, big string // the second column of each row
		hint       bool
	}{
		{[]string{"stats", "--queue", "small"}, "all 0 1 2 3", "", false},
		{[]string{"stats", "--queue", "small", "--summary"}, "4", "", false},
		{[]string{"stats", "--queue", "big"}, "", "12", true},
		{[]string{"stats", "--queue", "big", "--shards"}, "", "all 0 1 2 3 4 5 6 7 8 9 10 11", false},
		{[]string{"stats", "--queue", "small", "--queue", "big"}, "4", "12", true},
	}
	for _, tt := range tests {
		out, errOut, code := runCLI(t, tt.args...)
		cmd := strings.Join(tt.args, " ")
		if code != exitOK {
			t.Errorf("%s: exit %d, %q", cmd, code, errOut)
			continue
		}
		if got := strings.Join(rowsOf(out, "small"), " "); got != tt.small {
			t.Errorf("%s: rows of small %q, want %q:\n%s", cmd, got, tt.small, out)
		}
		if got := strings.Join(rowsOf(out, "big"), " "); got != tt.big {
			t.Errorf("%s: rows of big %q, want %q:\n%s", cmd, got, tt.big, out)
		}
		if hint := strings.Contains(out, "--shards shows every shard"); hint != tt.hint {
			t.Errorf("%s: hint shown %v, want %v:\n%s", cmd, hint, tt.hint, out)
		}
		if tt.big == "12" && (!strings.Contains(out, "queue big shard 3 is broken: WRONGTYPE") || !strings.Contains(out, "queue big shard 5 is broken: WRONGTYPE")) {
			t.Errorf("%s: the summary does not name the broken shards:\n%s", cmd, out)
		}
	}
	if _, errOut, code := runCLI(t, "stats", "--queue", "big", "--summary", "--shards"); code != exitSettings || !strings.Contains(errOut, "--summary and --shards") {
		t.Errorf("--summary --shards: exit %d, %q", code, errOut)
	}
}

// TestBrokenNotes: in a summary, shards broken the same way share a line,
// eight named at most.
func TestBrokenNotes(t *testing.T) {
	q := queuestate.Queue{Name: "orders"}
	for i := range 12 {
		s := queuestate.Shard{Index: i}
		if i != 1 {
			s.Err = "not read: dial tcp: connection refused"
		}
		q.Shards = append(q.Shards, s)
	}
	q.Shards[7].Err = "WRONGTYPE key x holds a string"
	got := brokenNotes(q)
	want := []string{
		"queue orders shards 0, 2, 3, 4, 5, 6, 8, 9 and 2 more are broken: not read: dial tcp: connection refused",
		"queue orders shard 7 is broken: WRONGTYPE key x holds a string",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("brokenNotes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
