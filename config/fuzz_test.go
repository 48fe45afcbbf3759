package config_test

import (
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/config"
)

// fuzzSettings are the variables FuzzLoadSecrets sets to any value. The
// *_FILE settings are left out: Load reads the files they name, and a
// fuzzer must not read the machine's files.
var fuzzSettings = []string{
	"DISPATCHER_LEASE", "DISPATCHER_HTTP_ADDR", "DISPATCHER_BATCH_SIZE", "DISPATCHER_PIPELINE",
	"DISPATCHER_POLL_INTERVAL", "DISPATCHER_IDLE_POLL_INTERVAL", "DISPATCHER_CONFIRM_TIMEOUT", "DISPATCHER_SHUTDOWN_TIMEOUT",
	"DISPATCHER_STAMP_PUBLISHED", "DISPATCHER_MAX_MESSAGE_BYTES", "DISPATCHER_MAX_ATTEMPTS", "DISPATCHER_RETRY_MIN", "DISPATCHER_RETRY_MAX",
	"DISPATCHER_LOG_LEVEL", "DISPATCHER_LOG_FORMAT", "DISPATCHER_KEY_PREFIX", "DISPATCHER_QUEUES",
	"DISPATCHER_QUEUE_ORDERS_SHARDS", "DISPATCHER_QUEUE_ORDERS_EXCHANGE", "DISPATCHER_QUEUE_ORDERS_ROUTING_KEY",
	"DISPATCHER_QUEUE_ORDERS_SHARD", // unknown: a typo
	"DISPATCHER_REDIS_URL", "DISPATCHER_AMQP_URL",
}

// scramble maps letters and digits to others (rot13, rot5) and keeps the
// rest: a password and its scramble fail to parse the same way.
func scramble(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return 'a' + (r-'a'+13)%26
		case r >= 'A' && r <= 'Z':
			return 'A' + (r-'A'+13)%26
		case r >= '0' && r <= '9':
			return '0' + (r-'0'+5)%10
		}
		return r
	}, s)
}

// pieces are the parts of a password a parser might quote on their own:
// it splits at the characters that end a URL's userinfo, host or path.
func pieces(pw string) []string {
	return strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("/?#@:\" \t\r\n%", r) })
}

// FuzzLoadSecrets feeds the loader a Redis or AMQP URL holding a password
// and any other text, and any value for one more setting. Load must not
// panic; an error must be one line and must not show the password, whole
// or any piece of 4 or more characters. A piece counts as shown only if
// the error with the password scrambled shows the scrambled piece too, so
// text that merely happens to match (a variable name, a reason) does not.
func FuzzLoadSecrets(f *testing.F) {
	clearEnv(f)
	f.Add(uint8(0), "user", "s3cr3tPW", "host:6379/0", uint8(0), "30s")
	f.Add(uint8(0), "user", "s3cr3tPW", "host:badport/0", uint8(1), ":9090")
	f.Add(uint8(1), "u", "s3cr3t/PW", "host:5672/", uint8(2), "0")
	f.Add(uint8(2), "", "s3cr3t#PW", "host:6379/x", uint8(14), "or ders")
	f.Add(uint8(3), "guest", "s3cr3t?PW x", "host:notaport/", uint8(15), "s3cr3tPW")
	f.Add(uint8(8), "user", `s3"cr3tPW`, "host:6379/0?bogus=1", uint8(18), "4")
	f.Add(uint8(5), "user", "s3%41cr3tPW", "host:99999999999/", uint8(19), "http://x:s3cr3tPW@h")
	f.Fuzz(func(t *testing.T, kind uint8, user, pw, rest string, which uint8, value string) {
		if strings.ContainsRune(user+pw+rest+value, 0) {
			t.Skip("the environment cannot hold NUL")
		}
		schemes := []string{"redis://", "rediss://", "amqp://", "amqps://", "http://", ""}
		urlVar := "DISPATCHER_REDIS_URL"
		if kind&1 == 1 {
			urlVar = "DISPATCHER_AMQP_URL"
		}
		scheme := schemes[int(kind>>1)%len(schemes)]
		other := fuzzSettings[int(which)%len(fuzzSettings)]
		load := func(pw string) error {
			clearEnv(t)
			for k, v := range base() {
				t.Setenv(k, v)
			}
			t.Setenv(other, value)
			t.Setenv(urlVar, scheme+user+":"+pw+"@"+rest)
			s, err := config.Load()
			if err != nil && s != nil {
				t.Errorf("Load returned settings along with error %v", err)
			}
			return err
		}
		err := load(pw)
		if err == nil {
			return
		}
		text := err.Error()
		if strings.ContainsAny(text, "\r\n") {
			t.Fatalf("error spans several lines: %q", text)
		}
		if len(pw) < 4 {
			return // too short to tell from other text
		}
		err2 := load(scramble(pw))
		if err2 == nil {
			return
		}
		text2 := err2.Error()
		ps, ps2 := append(pieces(pw), pw), append(pieces(scramble(pw)), scramble(pw))
		for i, p := range ps {
			if len(p) >= 4 && p != ps2[i] && strings.Contains(text, p) && strings.Contains(text2, ps2[i]) {
				t.Fatalf("%s=%q with %s=%q: error shows %q of the password:\n%s", urlVar, scheme+user+":"+pw+"@"+rest, other, value, p, text)
			}
		}
	})
}
