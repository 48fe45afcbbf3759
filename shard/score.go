package shard

import (
	"math"
	"strconv"
)

// Scores outside the contract's due times in ms. Producers get them wrong
// in a few ways, each with its own reaction (docs/producers.md#bad-scores):
//
//   - below UndatedBelow (0, negative, -inf, or seconds before March
//     1973): no real due time. Dispatched at once; how late they are is
//     not known, so the oldest due age counts from when the sweeping
//     instance first saw one, not from 1970.
//   - SecondsScoreBelow down to UndatedBelow: seconds (LooksLikeSeconds),
//     dispatched at once, late from the time they meant.
//   - FarScoreFrom and up (+inf too): micro- or nanoseconds, due after
//     year 5138. They wait in pending until then (+inf forever), warned of.
const (
	UndatedBelow = 100_000_000
	FarScoreFrom = 100_000_000_000_000
)

// exactMs bounds the scores that are integers a float64 holds exactly,
// ±2^53: the claim script gives a score below -2^53 (-inf too) due time
// 0, and one above 2^53 is never claimed (year 285,000).
const exactMs = 1 << 53

// Undated reports whether a due time (ms, or a score) carries no real due
// time: under UndatedBelow.
func Undated(due int64) bool { return due < UndatedBelow }

// FarScore reports whether a score lies after year 5138 (micro- or
// nanoseconds, or +inf).
func FarScore(score float64) bool { return score >= FarScoreFrom }

// MeantMs is the due time a producer meant by a task's due time ms: a due
// time in seconds (LooksLikeSeconds) times 1000, one in ms as it is; ok
// is false for an Undated one.
func MeantMs(due int64) (ms int64, ok bool) {
	switch {
	case Undated(due):
		return 0, false
	case LooksLikeSeconds(due):
		return due * 1000, true
	}
	return due, true
}

// DueOf is the due time (ms) a task of score gets, as the claim script
// gives it: the score's floor; 0 for -inf and anything below -2^53. never
// is true for +inf and anything above 2^53: such a task is never claimed,
// and has no message_id.
func DueOf(score float64) (ms int64, never bool) {
	switch {
	case score > exactMs:
		return 0, true
	case score < -exactMs:
		return 0, false
	}
	return int64(math.Floor(score)), false
}

// FormatScore writes a score as Redis reads it back: integers without a
// fraction or exponent, "+inf" and "-inf".
func FormatScore(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// ShortMember is a member cut to at most n bytes for a log line or a
// note, with "…" when cut: a body may be megabytes.
func ShortMember(member string, n int) string {
	if len(member) <= n {
		return member
	}
	return member[:n] + "…"
}
