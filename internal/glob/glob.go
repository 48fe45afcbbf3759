// Package glob matches task bodies against the glob patterns of Redis's
// MATCH (KEYS, SCAN): the same pattern selects the same bodies whether a
// command filters in Redis or here, where a walk in due-time order cannot
// ask Redis to filter.
package glob

// Match reports whether s matches pattern, as Redis's stringmatchlen does:
// * any run of bytes, ? one byte, [abc] [^abc] [a-z] one byte of a class,
// \x the byte x. It works on bytes, not runes, as Redis does.
func Match(pattern, s string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for len(pattern) > 1 && pattern[1] == '*' {
				pattern = pattern[1:]
			}
			if len(pattern) == 1 {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if Match(pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(s) == 0 {
				return false
			}
			s = s[1:]
			pattern = pattern[1:]
		case '[':
			if len(s) == 0 {
				return false
			}
			var ok bool
			ok, pattern = class(pattern[1:], s[0])
			if !ok {
				return false
			}
			s = s[1:]
		case '\\':
			if len(pattern) >= 2 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if len(s) == 0 || pattern[0] != s[0] {
				return false
			}
			s = s[1:]
			pattern = pattern[1:]
		}
	}
	return len(s) == 0
}

// class matches c against the class that p starts (just after '[') and
// returns the pattern after its ']'. An unclosed class runs to the end, as
// in Redis.
func class(p string, c byte) (bool, string) {
	not := len(p) > 0 && p[0] == '^'
	if not {
		p = p[1:]
	}
	match := false
	for len(p) > 0 && p[0] != ']' {
		switch {
		case p[0] == '\\' && len(p) >= 2:
			if p[1] == c {
				match = true
			}
			p = p[2:]
		case len(p) >= 3 && p[1] == '-' && p[2] != ']':
			lo, hi := p[0], p[2]
			if lo > hi {
				lo, hi = hi, lo
			}
			if c >= lo && c <= hi {
				match = true
			}
			p = p[3:]
		default:
			if p[0] == c {
				match = true
			}
			p = p[1:]
		}
	}
	if len(p) > 0 {
		p = p[1:] // the ']'
	}
	return match != not, p
}
