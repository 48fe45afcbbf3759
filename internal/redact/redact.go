// Package redact hides secrets before text reaches a log or an error.
package redact

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

var userinfoRE = regexp.MustCompile(`(://[^/@:\s"]*:)[^@/\s"]*@`)

// queryPasswordRE finds a password given as a query parameter, as the
// Sentinel URL gives the primary's (redis+sentinel://...&password=...).
var queryPasswordRE = regexp.MustCompile(`([?&](?:sentinel_)?password=)[^&#\s"]*`)

// String hides the password of every well-formed URL in s.
func String(s string) string {
	return queryPasswordRE.ReplaceAllString(userinfoRE.ReplaceAllString(s, "${1}xxxxx@"), "${1}xxxxx")
}

// URL hides the passwords of one URL: the one in its user info and any
// password= query parameter.
func URL(raw string) string { return queryPasswordRE.ReplaceAllString(userinfoURL(raw), "${1}xxxxx") }

// listStartRE finds where each URL of a comma-separated list begins.
var listStartRE = regexp.MustCompile(`(?i),\s*[a-z][a-z0-9+.-]*://`)

// SplitList splits a comma-separated list of URLs (the nodes of
// DISPATCHER_AMQP_URL) as written, spaces kept. A comma only splits where
// a URL follows it, so a comma in a password (allowed unencoded in user
// info) stays in its URL instead of cutting it in two and showing half
// the password as a "URL". The settings read the list with it too, so
// what is redacted is what is read.
func SplitList(list string) []string {
	var out []string
	start := 0
	for _, m := range listStartRE.FindAllStringIndex(list, -1) {
		out = append(out, list[start:m[0]])
		start = m[0] + 1
	}
	return append(out, list[start:])
}

// URLs hides the passwords of a comma-separated list of URLs, each on its
// own: URL on the whole list would take everything up to the last '@' for
// one password and hide the hosts in between.
func URLs(list string) string {
	parts := SplitList(list)
	for i, p := range parts {
		parts[i] = URL(p)
	}
	return strings.Join(parts, ",")
}

// userinfoURL hides the password of one URL, parsed or not: everything
// between the user name and the last '@' of the authority goes, so a
// password with unencoded '/', '?', '#' or spaces is hidden too.
func userinfoURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		// Trust the parser only if the password it found is the one written
		// up to the last '@': with an unencoded '@' and then '#', '/' or '?'
		// in a password, the parser takes its tail for the host, a path or
		// a fragment, and Redacted would show it.
		parsed, _ := u.User.Password()
		written := Password(raw)
		if dec, err := url.PathUnescape(written); parsed == written || (err == nil && parsed == dec) {
			return u.Redacted()
		}
	}
	prefix, rest := "", raw
	if scheme, r, ok := strings.Cut(raw, "://"); ok {
		prefix, rest = scheme+"://", r
	}
	// Without a scheme ("user:pw@host", the scheme forgotten) the password
	// is there all the same.
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPw := strings.Cut(rest[:at], ":")
	if !hasPw {
		return raw
	}
	return prefix + user + ":xxxxx@" + rest[at+1:]
}

// Passwords returns every password a URL holds as written: its user
// info's and any password= query parameter's.
func Passwords(raw string) []string {
	var out []string
	if pw := Password(raw); pw != "" {
		out = append(out, pw)
	}
	for _, m := range queryPasswordRE.FindAllStringSubmatchIndex(raw, -1) {
		if pw := raw[m[3]:m[1]]; pw != "" {
			out = append(out, pw)
		}
	}
	return out
}

// Password returns the password part of a URL as written, or "". A URL
// without a scheme ("user:pw@host") has one too.
func Password(raw string) string {
	rest := raw
	if _, r, ok := strings.Cut(raw, "://"); ok {
		rest = r
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// Leaks reports whether text shows pw or a recognisable piece of it, as
// written, percent-decoded or escaped the way %q escapes (URL parsers
// quote pieces of a password they took for a port or a path, and net/url
// quotes the whole URL when it holds a control character).
func Leaks(text, pw string) bool {
	if pw == "" {
		return false
	}
	forms := []string{pw}
	if dec, err := url.PathUnescape(pw); err == nil {
		forms = append(forms, dec)
	}
	for _, f := range forms {
		if q := strconv.Quote(f); q[1:len(q)-1] != f {
			forms = append(forms, q[1:len(q)-1])
		}
	}
	for _, f := range forms {
		if strings.Contains(text, f) {
			return true
		}
		for _, part := range strings.FieldsFunc(f, func(r rune) bool { return strings.ContainsRune(`/?#@:" `, r) }) {
			if len(part) >= 3 && strings.Contains(text, part) {
				return true
			}
		}
	}
	return false
}

// Error is err with the passwords of URLs in its text hidden; errors.Is
// and errors.As still see the original.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return scrubbed{err}
}

type scrubbed struct{ err error }

func (s scrubbed) Error() string { return String(s.err.Error()) }
func (s scrubbed) Unwrap() error { return s.err }
