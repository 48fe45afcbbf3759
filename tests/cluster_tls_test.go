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
)

// clusterCommands is what go-redis's cluster client needs on top of
// dispatcherCommands. CLUSTER SLOTS reads the slot map: without it the
// dispatcher cannot start (NOPERM). COMMAND reads
// the command table for routing: without it everything still works, but
// go-redis logs a warning and, since it does not cache the failure, sends
// COMMAND again (to up to 3 nodes) before nearly every command, each one a
// refusal in the nodes' ACL logs.
const clusterCommands = "+cluster|slots +command"

// TestClusterTLSAndACL dispatches end to end on a Redis Cluster that
// speaks TLS only (custom CA, client certificates required) with the
// default user off, as an ACL user limited to its own keys and channels,
// dispatcherCommands and clusterCommands, set on every node. Every task
// arrives once; the password is never shown; the nodes' ACL logs show the
// dispatcher tried nothing else it may not do.
func TestClusterTLSAndACL(t *testing.T) {
	began := time.Now()
	certs := testenv.NewCerts(t)
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{TLS: &certs, Users: []string{"user default off"}})
	t.Logf("TLS cluster up in %s", time.Since(began).Round(time.Millisecond))
	q := queueSpec{Name: "ctls", Shards: 16}
	h := newHarnessOn(t, c.Client(), q)
	ctx := context.Background()

	b := make([]byte, 12)
	_, _ = rand.Read(b)
	password := "pw-" + hex.EncodeToString(b)
	rules := []any{"ACL", "SETUSER", "dispatcher", "reset", "on", ">" + password,
		"~" + h.prefix + ":*", "&" + h.prefix + ":*"}
	for _, cmd := range strings.Fields(dispatcherCommands + " " + clusterCommands) {
		rules = append(rules, cmd)
	}
	// ACLs are per node: the user is set on every one, replicas included
	// (a replica promoted later serves the same user).
	for _, s := range c.Servers() {
		rc := s.Client()
		if err := rc.Do(ctx, rules...).Err(); err != nil {
			t.Fatalf("ACL SETUSER on %s: %v", s.Addr(), err)
		}
		if err := rc.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
	}
	seeds := strings.TrimPrefix(c.URL(), "rediss+cluster://")
	h.extra["DISPATCHER_REDIS_URL"] = "rediss+cluster://dispatcher:" + password + "@" + seeds
	h.extra["DISPATCHER_REDIS_CA_FILE"] = certs.CA
	h.extra["DISPATCHER_REDIS_CERT_FILE"] = certs.ClientCert
	h.extra["DISPATCHER_REDIS_KEY_FILE"] = certs.ClientKey
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	// Small batches come back full: the balancer and the backlog
	// announcements (PUBLISH) run under the ACL too.
	h.extra["DISPATCHER_BATCH_SIZE"] = "20"

	p := h.start()
	want := scheduleSpread(t, h.producer(q.Name), "ct", 1500, time.Now().Add(time.Second), 3*time.Second)
	h.verify(q.Name, want, 30*time.Second, 0)
	if pe, f, d := h.leftovers(q); pe+f+d != 0 {
		t.Errorf("left pending %d, in flight %d, dead %d", pe, f, d)
	}
	metrics := get(t, "http://"+addr+"/metrics")
	// Stopping gives up the sweeper role (a script with DEL and PUBLISH).
	p.signal(syscall.SIGTERM)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}

	out := p.out.String()
	if !strings.Contains(out, "rediss+cluster://dispatcher:xxxxx@"+seeds) {
		t.Errorf("start line does not show the redacted rediss+cluster:// URL:\n%s", tail(out, 2000))
	}
	if !strings.Contains(out, "redis_mode=cluster") {
		t.Errorf("start line does not say redis_mode=cluster:\n%s", tail(out, 2000))
	}
	// The slot map was read: the shards are placed on the primaries.
	for _, prim := range c.Primaries() {
		if !strings.Contains(out, "primary="+prim.Addr) {
			t.Errorf("start-up log names no shards on primary %s:\n%s", prim.Addr, tail(out, 3000))
		}
	}
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("errors logged:\n%s", grep(out, "level=ERROR"))
	}
	// Refusals the dispatcher logged: only the start checks' CONFIG GET
	// (without +command, go-redis would warn "getting command info: NOPERM").
	for _, line := range strings.Split(grep(out, "NOPERM"), "\n") {
		if line != "" && !strings.Contains(line, "'config|get'") {
			t.Errorf("ACL refusal logged: %s", line)
		}
	}
	for what, s := range map[string]string{"output": out, "/metrics": metrics} {
		if strings.Contains(s, password) {
			t.Errorf("the Redis password appears in the %s", what)
		}
	}
	// Every command any node refused the dispatcher: only the optional
	// CONFIG GET of the start checks may be there.
	refused := 0
	for _, s := range c.Servers() {
		entries, err := s.Client().Do(ctx, "ACL", "LOG").Slice()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			f := aclLogEntry(e)
			if f["username"] != "dispatcher" {
				continue
			}
			refused++
			if f["object"] != "config|get" {
				t.Errorf("ACL on %s refused the dispatcher something it needs: %v", s.Addr(), f)
			}
		}
	}
	t.Logf("ACL logs: %d refusals of the dispatcher, all of CONFIG GET; grants beyond dispatcherCommands: %s", refused, clusterCommands)
	t.Logf("TestClusterTLSAndACL took %s", time.Since(began).Round(time.Millisecond))
}

// aclLogEntry turns one ACL LOG entry (RESP2: a flat list of field names
// and values) into a map of its string fields.
func aclLogEntry(e any) map[string]string {
	out := map[string]string{}
	switch v := e.(type) {
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			out[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
		}
	case map[any]any:
		for k, x := range v {
			out[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	}
	return out
}
