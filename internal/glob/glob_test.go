package glob

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
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
}

func TestMatch(t *testing.T) {
	for _, c := range cases {
		if got := Match(c.pattern, c.s); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// TestMatchAgreesWithRedis checks each case against Redis's own MATCH, on
// a real server: the bulk commands promise the same selection as SCAN.
func TestMatchAgreesWithRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("this test needs Redis on 127.0.0.1:6379: %v", err)
	}
	key := fmt.Sprintf("test:glob:%d", rdb.Incr(ctx, "test:glob:n").Val())
	defer rdb.Del(ctx, key)
	for i, c := range cases {
		if c.pattern == "" {
			continue // go-redis sends no MATCH for an empty pattern
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
