package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Which answers of Redis are worth waiting for at start, and which are
// not. The daemon waits for Redis at start and the CLI reports what it
// finds; both ask Check, so both tell an operator the same thing.
//
// Permanent: answers that only a change of the settings (or of the
// server's configuration) can change, so the process exits with code 2 and
// one line, like any other bad setting; a restarted process (Kubernetes
// restarts it with backoff) picks up a fix on either side:
//
//   - ERR DB index is out of range: the URL names a database the server
//     does not have (its `databases` setting, 16 by default).
//   - ERR SELECT is not allowed in cluster mode: a database other than 0 on
//     a cluster node.
//   - WRONGPASS: the user or password is wrong, or the user is disabled.
//   - NOAUTH: the server requires a password and the URL gives none.
//   - NOPERM: the ACL user may not run a command the start needs (PING,
//     GET and SET of the shard count, CLUSTER SLOTS on a cluster), or
//     touch the key prefix's keys; inside a script the same refusal reads
//     "ERR The user executing the script can't run this command".
//
// Transient: everything else, waited for with backoff: no connection
// (refused, reset, timed out, DNS), TLS handshake failures (a certificate
// may be in the middle of a rotation), LOADING, BUSY, MASTERDOWN,
// CLUSTERDOWN, TRYAGAIN, max clients reached, and any answer not listed
// above.
//
// Only the start is judged this way. Once running, the daemon never exits
// on a Redis answer: a password changed under a running instance, say, is
// retried and logged, and /readyz says why.
var permanent = []struct{ prefix, hint string }{
	{"ERR DB index is out of range", "the database number at the end of the URL is not one the server has (its `databases` setting)"},
	{"ERR SELECT is not allowed in cluster mode", "a Redis Cluster has database 0 only: use redis+cluster:// without a database number"},
	{"WRONGPASS", "the user or the password in the URL is wrong, or the user is disabled"},
	{"NOAUTH", "the server requires a password: give the user and password in the URL"},
	{"NOPERM", "the ACL user lacks a command or key the dispatcher needs (see docs/how-it-works.md#redis-acls)"},
	// NOPERM as a script sees it (the CLI's reads run scripts).
	{"ERR The user executing the script can't run this command", "the ACL user lacks a command or key the dispatcher needs (see docs/how-it-works.md#redis-acls)"},
}

// Permanent reports whether err is an answer of Redis that waiting does
// not change (see above).
func Permanent(err error) bool {
	_, ok := permanentHint(err)
	return ok
}

func permanentHint(err error) (string, bool) {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return "", false
	}
	for _, p := range permanent {
		if strings.HasPrefix(re.Error(), p.prefix) {
			return p.hint, true
		}
	}
	return "", false
}

// RefusedError is a permanent answer of Redis (see Permanent), with what
// to change.
type RefusedError struct {
	Addr string // the server that answered; "" when not known
	Err  error
}

func (e *RefusedError) Error() string {
	hint, _ := permanentHint(e.Err)
	at := ""
	if e.Addr != "" {
		at = " " + e.Addr
	}
	return fmt.Sprintf("Redis%s refuses it: %v (%s)", at, e.Err, hint)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Refused returns err as a *RefusedError if it is permanent (see
// Permanent), and err itself otherwise.
func Refused(addr string, err error) error {
	var re *RefusedError
	if !Permanent(err) || errors.As(err, &re) {
		return err
	}
	return &RefusedError{Addr: addr, Err: err}
}

// Check asks Redis for PING (on a cluster, one node: a primary that is
// down holds up only its own shards, never the start): nil when it
// answers, a *RefusedError for a permanent refusal, otherwise the error to
// wait out.
func Check(ctx context.Context, rdb redis.UniversalClient) error {
	addr := ""
	// A Sentinel client's Addr is a placeholder: its primary changes.
	if c, ok := rdb.(*redis.Client); ok && c.Options().Addr != "FailoverClient" {
		addr = c.Options().Addr
	}
	return Refused(addr, rdb.Ping(ctx).Err())
}
