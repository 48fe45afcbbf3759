package redact

import "testing"

// Found by config's FuzzLoadSecrets: a password with an unencoded '@'
// followed by '#', '/' or '?' parses as a shorter password and a host,
// path or fragment that holds the rest of it.
func TestURLPasswordWithAtAndDelimiter(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://u:p@ss#word@host:6379/0": "redis://u:xxxxx@host:6379/0",
		"amqp://u:p@ss/word@host/":        "amqp://u:xxxxx@host/",
		"redis://u:p@ss?word@host:6379/0": "redis://u:xxxxx@host:6379/0",
		"rediss://0:@00#@0":               "rediss://0:xxxxx@0",
		// An '@' after the authority makes the rule hide too much, never
		// too little.
		"redis://u:pw@host:6379/0?x=a@b": "redis://u:xxxxx@b",
		// The scheme forgotten.
		"user:s3cr3t@host:6379": "user:xxxxx@host:6379",
		"0:0000@0":              "0:xxxxx@0",
		"a:b":                   "a:b",
	} {
		if got := URL(raw); got != want {
			t.Errorf("URL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// Found by config's FuzzLoadSecrets: net/url quotes a URL holding a
// control character with %q, so the password shows escaped.
func TestLeaksEscaped(t *testing.T) {
	if !Leaks(`parse "http://0: \n0000@0": net/url: invalid control character in URL`, " \n0000") {
		t.Error("Leaks misses a password shown Go-escaped")
	}
}

// A list of URLs keeps every host and hides every password, a comma in a
// password included.
func TestURLs(t *testing.T) {
	in := "amqp://u:s3cr,et@h1:5672/, amqps://u:s3cret@h2:5671/v,AMQP://h3"
	want := "amqp://u:xxxxx@h1:5672/, amqps://u:xxxxx@h2:5671/v,AMQP://h3"
	if got := URLs(in); got != want {
		t.Errorf("URLs(%q) =\n%q, want\n%q", in, got, want)
	}
	if got := URLs("redis://:pw@h:6379/0"); got != "redis://:xxxxx@h:6379/0" {
		t.Errorf("one URL: %q", got)
	}
}
