// Package glob matches task bodies against the glob patterns of Redis's
// MATCH (KEYS, SCAN): the same pattern selects the same bodies whether a
// command filters in Redis or here, where a walk in due-time order cannot
// ask Redis to filter.
package glob

import "fmt"

// Match reports whether s matches pattern as Redis 7's SCAN ... MATCH
// does: * any run of bytes, ? one byte, [abc] [^abc] [a-z] one byte of a
// class, \x the byte x, on bytes, not runes. It is a port of Redis's
// stringmatchlen (util.c), quirks included (an unclosed class, a range
// ending in ']'), with its cut that keeps * linear in the body rather
// than exponential in the number of *s. SCAN skips matching for the
// pattern "*" alone, so "*" matches every body, the empty one too.
// Patterns Check refuses have no reading common to every Redis: callers
// refuse them first (Match compares their range ends unsigned).
func Match(pattern, s string) bool {
	if pattern == "*" {
		return true
	}
	skip := false
	return match(pattern, s, &skip)
}

// match is stringmatchlen_impl: skipLonger is set once the rest of the
// pattern after a * matched nowhere in the rest of s, so that an earlier
// * need not try longer runs (Redis's fix for CVE-2022-36021).
func match(p, s string, skipLonger *bool) bool {
	for len(p) > 0 && len(s) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 1 && p[1] == '*' {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for len(s) > 0 {
				if match(p[1:], s, skipLonger) {
					return true
				}
				if *skipLonger {
					return false
				}
				s = s[1:]
			}
			*skipLonger = true
			return false
		case '?':
			s = s[1:]
		case '[':
			var ok bool
			ok, p = class(p[1:], s[0])
			if !ok {
				return false
			}
			s = s[1:]
		case '\\':
			if len(p) >= 2 {
				p = p[1:]
			}
			fallthrough
		default:
			if p[0] != s[0] {
				return false
			}
			s = s[1:]
		}
		p = p[1:]
		if len(s) == 0 {
			for len(p) > 0 && p[0] == '*' {
				p = p[1:]
			}
			break
		}
	}
	return len(p) == 0 && len(s) == 0
}

// class matches c against the class p starts (just after '['). It
// returns the pattern from the class's last byte, which the caller steps
// past, as Redis does.
func class(p string, c byte) (bool, string) {
	not := len(p) > 0 && p[0] == '^'
	if not {
		p = p[1:]
	}
	matched := false
	p = walkClass(p, func(lo, hi byte, _ bool) {
		if lo > hi {
			lo, hi = hi, lo
		}
		if c >= lo && c <= hi {
			matched = true
		}
	})
	return matched != not, p
}

// walkClass reads the members of the class p starts (after '[' and any
// '^') as Redis does, calling each with a byte (lo == hi) or a range as
// written. It returns the pattern from the class's last byte (its ']', or
// the pattern's last byte when unclosed), which the caller steps past.
// Match and Check share it so that both read a class the same way.
func walkClass(p string, each func(lo, hi byte, isRange bool)) string {
	for {
		switch {
		case len(p) >= 2 && p[0] == '\\':
			p = p[1:]
			each(p[0], p[0], false)
		case len(p) > 0 && p[0] == ']':
			return p
		case len(p) == 0:
			// Unclosed: Redis steps back onto the last byte, which the
			// caller then steps past. A pattern of "[" alone has none:
			// give the caller one to step past.
			return " "
		case len(p) >= 3 && p[1] == '-':
			each(p[0], p[2], true)
			p = p[2:]
		default:
			each(p[0], p[0], false)
		}
		p = p[1:]
	}
}

// Check refuses a pattern that Redis's MATCH reads differently on
// different platforms: one with a class range whose end is past ASCII
// (a byte of 0x80 or more). Redis compares range ends as C chars, signed
// on x86-64 and unsigned on arm64 Linux, so "[a-é]" selects other bodies
// on each, and Match cannot agree with both. Nor does such a range mean
// what it seems to: a non-ASCII character is several bytes in UTF-8, and
// a range spans bytes. Every other pattern selects the same bodies on
// every Redis, and Match reads it so. A non-ASCII byte elsewhere, even as
// a single member of a class ("[é]"), is fine.
func Check(pattern string) error {
	for p := pattern; len(p) > 0; p = p[1:] {
		switch p[0] {
		case '\\':
			if len(p) >= 2 {
				p = p[1:]
			}
		case '[':
			q := p[1:]
			if len(q) > 0 && q[0] == '^' {
				q = q[1:]
			}
			bad := ""
			p = walkClass(q, func(lo, hi byte, isRange bool) {
				if isRange && bad == "" && (lo >= 0x80 || hi >= 0x80) {
					bad = string([]byte{lo, '-', hi})
				}
			})
			if bad != "" {
				return fmt.Errorf("glob %q: the class range %q has an end past ASCII, which Redis's MATCH compares as a signed byte on some platforms (x86-64) and unsigned on others (arm64), and a non-ASCII character is several bytes: give ranges ASCII ends and list other bytes singly", pattern, bad)
			}
		}
	}
	return nil
}
