package redact

import (
	"errors"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://:pw@host:6379/0":           "redis://:xxxxx@host:6379/0",
		"amqp://guest:guest@localhost/":     "amqp://guest:xxxxx@localhost/",
		"redis://user:pa/ss?x#y@host:1/0":   "redis://user:xxxxx@host:1/0",
		"redis://host:6379/0":               "redis://host:6379/0",
		"redis://user@host/0":               "redis://user@host/0",
		"not a url":                         "not a url",
		"rediss://u:p%40ss@host:6380/1?x=1": "rediss://u:xxxxx@host:6380/1?x=1",
	} {
		if got := URL(raw); got != want {
			t.Errorf("URL(%q) = %q, want %q", raw, got, want)
		}
	}
}

func TestStringAndError(t *testing.T) {
	err := Error(errors.New(`dial amqp://u:s3cr3t@h:5672/: refused`))
	if strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "amqp://u:xxxxx@h:5672/") {
		t.Fatal(err)
	}
	base := errors.New("base")
	if !errors.Is(Error(base), base) || Error(nil) != nil {
		t.Fatal("Error must wrap")
	}
}

func TestLeaks(t *testing.T) {
	pw := Password("redis://user:ab/cdef@host/0")
	if pw != "ab/cdef" {
		t.Fatalf("Password = %q", pw)
	}
	if !Leaks(`invalid URL path: /cdef@host/0`, pw) || Leaks("invalid port", pw) || Leaks("x", "") {
		t.Fatal("Leaks")
	}
}

func FuzzURL(f *testing.F) {
	for _, s := range []string{"redis://u:p@h/0", "amqp://a:b/c@d", "x://:@", "://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		pw := Password(raw)
		_, authority, _ := strings.Cut(URL(raw), "://")
		if len(pw) >= 3 && !strings.Contains(pw, "xxxxx") && strings.Contains(authority, ":"+pw+"@") {
			t.Fatalf("URL(%q) = %q still shows %q", raw, URL(raw), pw)
		}
	})
}

func TestQueryPasswordHidden(t *testing.T) {
	raw := "redis+sentinel://su:s3cret-one@127.0.0.1:26379?addr=127.0.0.1:26380&master_name=m&password=pr1mary-pw&db=0"
	for name, got := range map[string]string{"URL": URL(raw), "String": String("dial " + raw + " failed")} {
		if strings.Contains(got, "s3cret-one") || strings.Contains(got, "pr1mary-pw") {
			t.Errorf("%s shows a password: %s", name, got)
		}
		if !strings.Contains(got, "master_name=m") || !strings.Contains(got, "password=xxxxx") {
			t.Errorf("%s hides more than the passwords: %s", name, got)
		}
	}
	if got := Passwords(raw); len(got) != 2 || got[0] != "s3cret-one" || got[1] != "pr1mary-pw" {
		t.Errorf("Passwords = %q", got)
	}
}
