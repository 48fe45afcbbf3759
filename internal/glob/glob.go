// Package glob matches task bodies against the glob patterns of Redis's
// MATCH (KEYS, SCAN): the same pattern selects the same bodies whether a
// command filters in Redis or here, where a walk in due-time order cannot
// ask Redis to filter.
package glob

// Match reports whether s matches pattern as Redis 7's SCAN ... MATCH
// does: * any run of bytes, ? one byte, [abc] [^abc] [a-z] one byte of a
// class, \x the byte x, on bytes, not runes. It is a port of Redis's
// stringmatchlen (util.c), quirks included (an unclosed class, a range
// ending in ']'), with its cut that keeps * linear in the body rather
// than exponential in the number of *s. SCAN skips matching for the
// pattern "*" alone, so "*" matches every body, the empty one too.
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
// returns the pattern from the class's last byte (its ']', or the
// pattern's last byte when unclosed), which the caller steps past, as
// Redis does.
func class(p string, c byte) (bool, string) {
	not := len(p) > 0 && p[0] == '^'
	if not {
		p = p[1:]
	}
	matched := false
	for {
		switch {
		case len(p) >= 2 && p[0] == '\\':
			p = p[1:]
			if p[0] == c {
				matched = true
			}
		case len(p) > 0 && p[0] == ']':
			return matched != not, p
		case len(p) == 0:
			// Unclosed: Redis steps back onto the last byte, which the
			// caller then steps past. A pattern of "[" alone has none:
			// give the caller one to step past.
			return matched != not, " "
		case len(p) >= 3 && p[1] == '-':
			lo, hi := p[0], p[2]
			if lo > hi {
				lo, hi = hi, lo
			}
			p = p[2:]
			if c >= lo && c <= hi {
				matched = true
			}
		default:
			if p[0] == c {
				matched = true
			}
		}
		p = p[1:]
	}
}
