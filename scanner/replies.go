package scanner

import (
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// What Redis's answers mean to the scanner, and how long it waits for
// them: every concern that calls Redis (claims, the sweeper role, the
// balancer counter, the rate limit) reads its errors the same way.

// Time limits of the loop's Redis calls. go-redis honours them because
// redisconn turns ContextTimeoutEnabled on; without them a primary that
// stopped answering would hold a claim for the read timeout times go-redis's
// retries and redirects (about 20 s on a cluster).
const (
	pausedRetry    = time.Second     // a paused shard is claimed from again after
	claimTimeout   = 3 * time.Second // one job's pipeline
	counterTimeout = time.Second     // the balancer's INCRBY
)

// serverRefuses reports whether err is Redis refusing every command for
// now (loading its data, a read-only replica, a busy script, an ACL or
// authentication problem) rather than trouble with one shard's keys: the
// loop backs off and logs it once, instead of blaming every shard.
func serverRefuses(err error) bool {
	if scriptNoPerm(err) {
		return true
	}
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "BUSY ", "NOPERM", "NOAUTH", "WRONGPASS", "OOM"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// redisHints explain the Redis refusals an operator can act on.
var redisHints = map[string]string{
	"LOADING":  "Redis is loading its data set after a restart; dispatching resumes when it is done",
	"READONLY": "DISPATCHER_REDIS_URL reaches a read-only replica; the dispatcher needs the primary",
	"OOM":      "Redis is at maxmemory: producers cannot schedule; the dispatcher keeps draining, which frees memory",
	"NOPERM":   "the Redis ACL user lacks a key, channel or command the dispatcher needs",
}

// scriptNoPerm reports whether err is Redis refusing a script's call that
// the ACL user may not run: Redis 7 answers that with this ERR text, not
// NOPERM, but it is the same refusal.
func scriptNoPerm(err error) bool {
	// (HasErrorPrefix reads past the "ERR ".)
	return redis.HasErrorPrefix(err, "The user executing the script can't run this command")
}

// redisErrorClass is the error code of a Redis reply error (LOADING,
// READONLY, OOM, ...; a script's refused call counts as NOPERM) or "conn"
// for anything else (network, timeout).
func redisErrorClass(err error) string {
	var re redis.Error
	if !errors.As(err, &re) {
		return "conn"
	}
	if scriptNoPerm(err) {
		return "NOPERM"
	}
	code, _, _ := strings.Cut(re.Error(), " ")
	return code
}

// isReply reports whether err is an error reply of the server (as opposed
// to a connection or timeout error).
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// clusterTransient reports whether err is Redis Cluster moving a slot or
// electing a primary (after go-redis's own redirects and retries): the
// shard is looked at again shortly, not set aside like a broken one.
func clusterTransient(err error) bool {
	for _, p := range []string{"TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}
