// Package redact hides secrets before text reaches a log or an error.
package redact

import (
	"net/url"
	"regexp"
)

var userinfoRE = regexp.MustCompile(`(://[^/@:\s"]*:)[^@/\s"]*@`)

// String hides the password of every URL in s.
func String(s string) string { return userinfoRE.ReplaceAllString(s, "${1}xxxxx@") }

// URL hides the password of one URL, parsed or not.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return String(raw)
	}
	return u.Redacted()
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
