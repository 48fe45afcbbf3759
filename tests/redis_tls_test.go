package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// dispatcherCommands is what the daemon and its operator commands run on
// Redis (SCAN for the operator commands given no queue and, with DBSIZE,
// for the daemon's scan of a small keyspace), scripts' own calls included
// (ACLs check those too): nothing else is granted to its user.
const dispatcherCommands = "+ping +evalsha +eval +script|load +time +type " +
	"+zadd +zrem +zrange +zrangebyscore +zrevrangebyscore +zrank +zremrangebyrank +zremrangebyscore +zscore +zmscore +zcard +zcount +hmget +hlen " +
	"+hexists +hdel +hincrby +hset +hget +hgetall +exists +zscan +scan +dbsize +get +mget +set +setnx +del +pexpire +multi +exec +incr +incrby " +
	"+publish +subscribe +unsubscribe +psubscribe +punsubscribe " +
	"+ssubscribe +sunsubscribe +pubsub|numsub +pubsub|shardnumsub"

// tlsACLServer starts a private Redis that speaks TLS only (custom CA,
// client certificates required) with the default user off, and adds a
// user for the dispatcher with a password and least privileges: its keys
// and channels (~prefix:* &prefix:*) and dispatcherCommands. It returns
// the server, the harness on its admin client, the user's password and the
// dispatcher's settings for it.
func tlsACLServer(t *testing.T, queue string) (*testenv.RedisServer, *harness, string, testenv.Certs) {
	certs := testenv.NewCerts(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{TLS: &certs, TLSAuthClients: true,
		MaxMemoryPolicy: "noeviction", Users: []string{"user default off"}})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: queue, Shards: 4})
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	password := "pw-" + hex.EncodeToString(b)
	rules := []any{"ACL", "SETUSER", "dispatcher", "reset", "on", ">" + password,
		"~" + h.prefix + ":*", "&" + h.prefix + ":*"}
	for _, c := range strings.Fields(dispatcherCommands) {
		rules = append(rules, c)
	}
	if err := h.rdb.Do(context.Background(), rules...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	h.extra["DISPATCHER_REDIS_URL"] = srv.URLFor("dispatcher", password)
	h.extra["DISPATCHER_REDIS_CA_FILE"] = certs.CA
	h.extra["DISPATCHER_REDIS_CERT_FILE"] = certs.ClientCert
	h.extra["DISPATCHER_REDIS_KEY_FILE"] = certs.ClientKey
	return srv, h, password, certs
}

// TestRedisTLSAndACL dispatches end to end over rediss:// with a custom CA
// and a client certificate, as an ACL user limited to its own keys,
// channels and commands. The start check that needs CONFIG GET (the
// maxmemory-policy warning) degrades to a note; Redis's ACL log shows the
// dispatcher tried nothing else it may not do; the password is never shown.
func TestRedisTLSAndACL(t *testing.T) {
	srv, h, password, _ := tlsACLServer(t, "tls")
	ctx := context.Background()
	if err := h.rdb.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	// Small batches come back full: the balancer and the backlog
	// announcements (PUBLISH) run under the ACL too.
	h.extra["DISPATCHER_BATCH_SIZE"] = "20"
	p := h.start()
	f := newFeeder(t, h.producer("tls"), "t", 3*time.Second, 10, "").start()
	verifyWhile(h, "tls", f.want, 30*time.Second, 0, f.wait)
	// Tasks with an id and properties under the same ACL: their claim
	// moves bodies and properties, their ack reads with ZMSCORE; a refused
	// call would leave them in flight, to go out again every lease.
	due := h.redisNow().Add(2 * time.Second)
	idWant := map[string]int64{}
	var idTasks []shard.IDTask
	for i := range 20 {
		id := []byte(fmt.Sprintf("acl-id-%d", i))
		idTasks = append(idTasks, shard.IDTask{ID: id, Body: []byte("body"), Props: &shard.Properties{ContentType: "text/plain"}, Due: due})
		idWant[shard.MessageID(id, due.UnixMilli())] = due.UnixMilli()
	}
	if err := h.producer("tls").ScheduleIDs(ctx, idTasks); err != nil {
		t.Fatal(err)
	}
	verifyWhile(h, "tls", idWant, 30*time.Second, 0, func() {})
	h.emptyAtEnd(h.queues[0])
	metrics := get(t, "http://"+addr+"/metrics")
	// Stopping gives up the sweeper role (a script with DEL and PUBLISH).
	p.signal(syscall.SIGTERM)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}

	out := p.out.String()
	if !strings.Contains(out, "rediss://dispatcher:xxxxx@"+srv.Addr()) {
		t.Errorf("start line does not show the redacted rediss:// URL:\n%s", tail(out, 2000))
	}
	if !strings.Contains(out, "cannot read maxmemory-policy") {
		t.Errorf("no note that the maxmemory-policy check was skipped:\n%s", tail(out, 2000))
	}
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("errors logged:\n%s", grep(out, "level=ERROR"))
	}
	for what, s := range map[string]string{"output": out, "/metrics": metrics} {
		if strings.Contains(s, password) {
			t.Errorf("the Redis password appears in the %s", what)
		}
	}
	// Every command the dispatcher was refused: only the optional CONFIG
	// GET of the start checks and the keyspace-event probe may be there.
	entries, err := h.rdb.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		s := fmt.Sprint(e)
		if !strings.Contains(s, "config|get") {
			t.Errorf("ACL refused the dispatcher something it needs: %s", s)
		}
	}
	t.Logf("ACL log: %d refusals, all of CONFIG GET", len(entries))
}

// TestRedisTLSAndACLRefusals: what an operator sees when the TLS or ACL
// settings are wrong. A wrong password exits 2 with one line, like a bad
// setting (Redis's answer will not change by waiting:
// redisconn.Permanent); a server certificate from an unknown CA is logged
// clearly while the dispatcher waits for Redis (certificates may be in the
// middle of a rotation); neither shows the password; a missing key file
// exits 2 at once, naming its variable.
func TestRedisTLSAndACLRefusals(t *testing.T) {
	srv, h, password, certs := tlsACLServer(t, "refuse")
	wrong := "wrong-" + password[len(password)-8:]
	cases := []struct {
		name   string
		env    map[string]string
		expect string // in the output
		exit   int    // -1: keeps running (waiting for Redis)
	}{
		{"wrong password", map[string]string{"DISPATCHER_REDIS_URL": srv.URLFor("dispatcher", wrong)},
			"WRONGPASS invalid username-password pair", 2},
		{"unknown CA", map[string]string{"DISPATCHER_REDIS_CA_FILE": ""},
			"certificate signed by unknown authority", -1},
		{"no client certificate", map[string]string{"DISPATCHER_REDIS_CERT_FILE": "", "DISPATCHER_REDIS_KEY_FILE": ""},
			"certificate required", -1},
		{"missing key file", map[string]string{"DISPATCHER_REDIS_KEY_FILE": certs.Dir + "/nonexistent-key.pem"},
			`DISPATCHER_REDIS_KEY_FILE="` + certs.Dir + `/nonexistent-key.pem": cannot read it: no such file or directory`, 2},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			env := h.env()
			for k, v := range c.env {
				if v == "" {
					delete(env, k)
				} else {
					env[k] = v
				}
			}
			p := start(t, env)
			if c.exit >= 0 {
				if code := p.wait(10 * time.Second); code != c.exit {
					t.Errorf("exit code %d, want %d", code, c.exit)
				}
			} else {
				eventually(t, 10*time.Second, "the problem logged", func() bool { return strings.Contains(p.out.String(), c.expect) })
				time.Sleep(300 * time.Millisecond) // would it exit or spin?
				if !p.running() {
					t.Errorf("dispatcher exited; it should keep waiting for Redis")
				}
			}
			out := p.out.String()
			t.Logf("%s: %s", c.name, strings.TrimSpace(tail(out, 600)))
			if !strings.Contains(out, c.expect) {
				t.Errorf("output does not say %q:\n%s", c.expect, out)
			}
			for _, secret := range []string{password, wrong} {
				if strings.Contains(out, secret) {
					t.Errorf("a password appears in the output:\n%s", out)
				}
			}
			if n := strings.Count(out, "waiting for Redis"); n > 1 {
				t.Errorf("logged %d times; once is enough", n)
			}
		})
	}
}
