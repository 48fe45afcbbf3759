// Package redact hides secrets before text reaches a log or an error.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

var userinfoRE = regexp.MustCompile(`(://[^/@:\s"]*:)[^@/\s"]*@`)

// String hides the password of every well-formed URL in s.
func String(s string) string { return userinfoRE.ReplaceAllString(s, "${1}xxxxx@") }

// URL hides the password of one URL, parsed or not: everything between
// the user name and the last '@' of the authority goes, so a password
// with unencoded '/', '?', '#' or spaces is hidden too.
func URL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		// Trust the parser unless what it kept looks like the password
		// the user meant (e.g. one with an unencoded '#').
		if r := u.Redacted(); !strings.Contains(r, ":"+Password(raw)+"@") {
			return r
		}
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return String(raw)
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPw := strings.Cut(rest[:at], ":")
	if !hasPw {
		return raw
	}
	return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
}

// Password returns the password part of a URL as written, or "".
func Password(raw string) string {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return ""
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// Leaks reports whether text shows pw or a recognisable piece of it, as
// written or percent-decoded (URL parsers quote pieces of a password they
// took for a port or a path).
func Leaks(text, pw string) bool {
	if pw == "" {
		return false
	}
	forms := []string{pw}
	if dec, err := url.PathUnescape(pw); err == nil {
		forms = append(forms, dec)
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
