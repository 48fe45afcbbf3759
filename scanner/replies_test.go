package scanner

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// redisError is an error reply as go-redis returns it.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

var _ redis.Error = redisError("")

// TestScriptNoPermIsAPermissionError: Redis answers a script's call that
// the ACL user may not run with "ERR The user executing the script can't
// run this command ..." rather than NOPERM. It is the same refusal: the
// whole server refuses (not one shard's keys), with the ACL hint.
func TestScriptNoPermIsAPermissionError(t *testing.T) {
	err := redisError("ERR The user executing the script can't run this command or subcommand script: ca26d80d7fe6b7934d11fdfe875e62fd83ceca6d, on @user_script:1.")
	if !serverRefuses(err) {
		t.Errorf("serverRefuses(%q) = false, want true: an ACL refusal, not one shard's trouble", err)
	}
	if got := redisErrorClass(err); got != "NOPERM" {
		t.Errorf("redisErrorClass(%q) = %q, want NOPERM (for its hint: %q)", err, got, redisHints["NOPERM"])
	}
	for _, e := range []redisError{"NOPERM this user has no permissions to run the 'zmscore' command", "LOADING Redis is loading"} {
		if !serverRefuses(e) {
			t.Errorf("serverRefuses(%q) = false, want true", e)
		}
	}
	if c := redisErrorClass(redisError("WRONGTYPE Operation against a key holding the wrong kind of value")); c != "WRONGTYPE" {
		t.Errorf("a wrong-type key classed %q, want WRONGTYPE", c)
	}
}
