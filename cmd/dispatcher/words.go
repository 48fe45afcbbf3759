package main

import (
	"strconv"
	"unicode/utf8"
)

// plural is n followed by the noun that agrees with it: "1 recurring
// schedule", "2 recurring schedules", "0 dead letters".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// bodyWidth is how much of a task's body a table shows.
const bodyWidth = 60

// shortBody is a body as a table shows it: quoted (Go syntax, so that
// control characters and invalid UTF-8 show), and cut to about width
// characters with "…" and the full length after it when longer, so that
// a long body does not push the other columns off the screen. --json
// gives every body whole.
func shortBody(body string, width int) string {
	q := strconv.Quote(body)
	if utf8.RuneCountInString(q) <= width {
		return q
	}
	runes := []rune(body)
	cut := min(len(runes), width)
	for cut > 0 && utf8.RuneCountInString(strconv.Quote(string(runes[:cut]))) > width {
		cut--
	}
	return strconv.Quote(string(runes[:cut])) + "… (" + plural(len(body), "byte", "bytes") + ")"
}
