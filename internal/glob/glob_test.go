package glob

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

var cases = []struct {
	pattern, s string
	want       bool
}{
	{"*", "", true},
	{"*", "anything", true},
	{"order:*", "order:42", true},
	{"order:*", "orders:42", false},
	{"*:42", "order:42", true},
	{"o?der:4[0-9]", "order:42", true},
	{"o?der:4[0-1]", "order:42", false},
	{"o?der:4[^0-1]", "order:42", true},
	{"*\"user\":7*", `{"user":7,"x":1}`, true},
	{"a\\*b", "a*b", true},
	{"a\\*b", "axb", false},
	{"[a-c]x", "bx", true},
	{"[c-a]x", "bx", true},
	{"[\\]]", "]", true},
	{"a*b*c", "aXbYc", true},
	{"a*b*c", "aXbY", false},
	{"??", "a", false},
	{"", "", true},
	{"", "a", false},
	{"[abc", "b", true},
	{"задача*", "задача 1", true},
	{"**", "", false},
	{"*", "", true},
	{"[c-]x", "dx", false},
	{"[c-]]", "d", false},
	{"[c-]]", "_", true}, // the range is ] to c: Redis reads the ] as its end
	{"a[", "a", false},
	{"[", "x", false},
	// Many *s that cannot match: linear, as in Redis, not exponential.
	{"*a*a*a*a*a*a*a*a*b", strings.Repeat("a", 200), false},
}

func TestMatch(t *testing.T) {
	for _, c := range cases {
		if got := Match(c.pattern, c.s); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// TestCheck: a class range with an end past ASCII is refused, naming the
// pattern and the range as Match reads it; a non-ASCII byte anywhere else
// is not.
func TestCheck(t *testing.T) {
	for _, ok := range []string{
		"", "*", "order:*", "[a-z]*", "é*", "*задача*", "[é]", "[^é]", "\\é", "[\\é]",
		"[a\\-é]", // an escaped '-' makes no range
		"[a-\\é]", // the range a-\, then two bytes
		"\\[a-é]", // no class: an escaped '['
		"[-é]", "[c-]]", "[é", "[",
	} {
		if err := Check(ok); err != nil {
			t.Errorf("Check(%q) = %v, want nil", ok, err)
		}
	}
	for pat, rng := range map[string]string{
		"[a-é]*":            "a-\xc3",
		"[é-z]":             "\xa9-z",
		"[^a-é]":            "a-\xc3",
		"x[\\é-z]":          "\xa9-z", // the escape takes only é's first byte
		"[\xff-a]":          "\xff-a",
		"[é-ÿ]":             "\xa9-\xc3", // both ends past ASCII: still no character range
		"*[a-z]?[0-9][0-é]": "0-\xc3",
		"[a-é":              "a-\xc3", // unclosed
		"[é-]":              "\xa9-]", // é's second byte to the ']'
		"[é-]]":             "\xa9-]",
	} {
		err := Check(pat)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("glob %q", pat)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("class range %q", rng)) {
			t.Errorf("Check(%q) = %v, want an error naming the pattern and the range %q", pat, err, rng)
		}
	}
}

// TestMatchAgreesWithRedis checks each case against Redis's own MATCH, on
// a real server: the bulk commands promise the same selection as SCAN.
func TestMatchAgreesWithRedis(t *testing.T) {
	ctx := context.Background()
	rdb, key := redisSet(t)
	for i, c := range cases {
		if c.pattern == "" || c.s == "" {
			continue // go-redis sends no MATCH for "", and SADD of "" is a member SSCAN shows
		}
		rdb.Del(ctx, key)
		if err := rdb.SAdd(ctx, key, c.s).Err(); err != nil {
			t.Fatal(err)
		}
		got, _, err := rdb.SScan(ctx, key, 0, c.pattern, 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if redisSays := len(got) == 1; redisSays != Match(c.pattern, c.s) {
			t.Errorf("case %d: Redis MATCH %q on %q says %v, Match says %v", i, c.pattern, c.s, redisSays, !redisSays)
		}
	}
}

// TestMatchAgreesWithRedisRandom compares random patterns and bodies of a
// small alphabet, quirks included, with Redis's SSCAN ... MATCH.
func TestMatchAgreesWithRedisRandom(t *testing.T) {
	ctx := context.Background()
	rdb, key := redisSet(t)
	rnd := rand.New(rand.NewPCG(1, 2))
	word := func(alphabet string, n int) string {
		b := make([]byte, rnd.IntN(n)+1)
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		return string(b)
	}
	// Bytes of 0x80 and above (é is 0xc3 0xa9) in bodies and patterns:
	// Redis compares a class's range ends as C chars, signed on x86-64.
	bodies := make([]string, 50)
	for i := range bodies {
		bodies[i] = word("ab-]\xc3\xa9\xff", 8)
	}
	if err := rdb.SAdd(ctx, key, bodies).Err(); err != nil {
		t.Fatal(err)
	}
	refused, nonASCII := 0, 0
	for i := range 300 {
		pat := word("ab*?[]^-\\\xc3\xa9\xff", 7)
		if i%2 == 1 {
			// Half start with a range, whose ends are often past ASCII.
			pat = "[" + word("ab-]\\\xc3\xa9\xff", 1) + "-" + word("ab-]\xc3\xa9\xff", 1) + pat
		}
		if err := Check(pat); err != nil {
			// Its reading depends on the platform Redis runs on.
			refused++
			continue
		}
		if strings.ContainsFunc(pat, func(r rune) bool { return r >= 0x80 }) {
			nonASCII++
		}
		got, _, err := rdb.SScan(ctx, key, 0, pat, 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		redisSays := map[string]bool{}
		for _, g := range got {
			redisSays[g] = true
		}
		for _, b := range bodies {
			if Match(pat, b) != redisSays[b] {
				t.Errorf("MATCH %q on %q: Redis says %v, Match says %v", pat, b, redisSays[b], !redisSays[b])
			}
		}
	}
	// The generator must reach both kinds, or the test proves little.
	if refused == 0 || nonASCII == 0 {
		t.Errorf("of 300 patterns %d refused, %d accepted with bytes past ASCII: want some of each", refused, nonASCII)
	}
	t.Logf("%d of 300 patterns refused; %d accepted with bytes past ASCII", refused, nonASCII)
}

// redisSet is a client of the test Redis and a set key of the test's own,
// removed at the end.
func redisSet(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb := testenv.Redis(t)
	key := testenv.Name(t) + ":glob"
	rdb.Del(context.Background(), key)
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	return rdb, key
}
