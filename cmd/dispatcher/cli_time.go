package main

import (
	"strconv"
	"strings"
	"time"
)

// timeHelp says what a time flag (--from, --to, --at of bulk commands)
// accepts; parseTime reads it.
const timeHelp = "an RFC 3339 time (2026-11-24T18:00:00Z), Unix ms, \"now\", or an offset from now (90s, -10m, +2h)"

// parseTime reads a time flag's value as Unix ms: an RFC 3339 time, an
// integer of Unix ms, "now", or a Go duration from now ("-10m" is ten
// minutes ago). The error names the flag and the value.
func parseTime(flag, v string, now time.Time) (int64, error) {
	s := strings.TrimSpace(v)
	switch {
	case s == "":
		return 0, usageErrorf("--%s: empty: want %s", flag, timeHelp)
	case s == "now":
		return now.UnixMilli(), nil
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		return ms, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UnixMilli(), nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(s, "+")); err == nil {
		return now.Add(d).UnixMilli(), nil
	}
	return 0, usageErrorf("--%s %q: not a time: want %s", flag, v, timeHelp)
}

// dueFlags reads the --in/--at pair of schedule and reschedule: exactly one
// of them, and a due time in the past only with --past (the task would go
// out at once), which the error says how to ask for.
func dueFlags(in, at string, past bool, now time.Time, doing string) (time.Time, error) {
	var due time.Time
	switch {
	case (in == "") == (at == ""):
		return due, usageErrorf("give one of --in (a duration, e.g. 10m) or --at (%s)", timeHelp)
	case in != "":
		d, err := time.ParseDuration(in)
		if err != nil {
			return due, usageErrorf("--in %q: not a duration (use Go syntax such as 90s, 10m, 2h)", in)
		}
		due = now.Add(d)
	default:
		ms, err := parseTime("at", at, now)
		if err != nil {
			return due, err
		}
		due = time.UnixMilli(ms)
	}
	if due.Before(now) && !past {
		return due, usageErrorf("due %s, %s ago: add --past to %s", due.UTC().Format(time.RFC3339),
			now.Sub(due).Round(time.Second), doing)
	}
	return due, nil
}
