package tests

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// AMQPS runs against the private node's TLS listener, which requires a
// client certificate signed by the node's CA (verify_peer,
// fail_if_no_peer_cert). The dispatcher logs in as a user of the test's own
// whose password differs from its name, so a password in the output is
// caught.

// tlsUser adds a user with a random password to node.
func tlsUser(t *testing.T, node *testenv.RabbitNode) (user, password string) {
	t.Helper()
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	user, password = "tls-"+hex.EncodeToString(b[:4]), "pw-"+hex.EncodeToString(b[4:])
	node.AddUser(t, user, password)
	return user, password
}

// TestAMQPSClientCertificate has the dispatcher connect with amqps:// and
// the CA, client certificate and key from its settings, and dispatch tasks
// end to end; the broker lists the connection as TLS with the client
// certificate's subject.
func TestAMQPSClientCertificate(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	user, password := tlsUser(t, node)
	h := newNodeHarness(t, node, queueSpec{Name: "tls", Shards: 4})
	h.extra["DISPATCHER_AMQP_URL"] = node.AMQPSURL(user, password)
	h.extra["DISPATCHER_AMQP_CA_FILE"] = node.Certs.CA
	h.extra["DISPATCHER_AMQP_CERT_FILE"] = node.Certs.ClientCert
	h.extra["DISPATCHER_AMQP_KEY_FILE"] = node.Certs.ClientKey
	p := h.start()
	want := scheduleSpread(t, h.producer("tls"), "s", 3000, time.Now().Add(200*time.Millisecond), 2*time.Second)
	h.verify("tls", want, 30*time.Second, 0)

	out, err := node.Ctl("list_connections", "user", "ssl", "peer_cert_subject", "client_properties")
	if err != nil {
		t.Fatal(err)
	}
	mine := grep(out, "pid "+strconv.Itoa(p.cmd.Process.Pid)+"\"")
	t.Logf("broker's view of the dispatcher's connection: %.120s", mine)
	if !strings.HasPrefix(mine, user+"\ttrue\t") || !strings.Contains(mine, "CN=dispatcher") {
		t.Errorf("the dispatcher's connection is not TLS as %s with the client certificate (CN=dispatcher): %q", user, mine)
	}
	if strings.Contains(p.out.String(), password) {
		t.Errorf("password in the dispatcher's output")
	}
}

// TestAMQPSRefused gives the dispatcher TLS settings the broker or the
// dispatcher itself must refuse. It keeps retrying, logs the TLS error once
// (never the password), /readyz says not ready and nothing is claimed;
// restarted with the right files, it delivers every task scheduled
// meanwhile.
func TestAMQPSRefused(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	user, password := tlsUser(t, node)
	stranger := testenv.NewCerts(t) // a CA the node does not know, and a client certificate it signed
	good := node.Certs
	for _, tc := range []struct {
		name          string
		ca, cert, key string
		wantLog       string
	}{
		{"no client certificate", good.CA, "", "", "tls: certificate required"},
		{"server certificate from an unknown CA", stranger.CA, good.ClientCert, good.ClientKey, "x509: certificate signed by unknown authority"},
		{"client certificate from an unknown CA", good.CA, stranger.ClientCert, stranger.ClientKey, "tls: unknown certificate authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newNodeHarness(t, node, queueSpec{Name: "tlsbad", Shards: 2})
			addr := testenv.FreeAddr(t)
			h.extra["DISPATCHER_HTTP_ADDR"] = addr
			h.extra["DISPATCHER_AMQP_URL"] = node.AMQPSURL(user, password)
			h.extra["DISPATCHER_AMQP_CA_FILE"] = tc.ca
			if tc.cert != "" {
				h.extra["DISPATCHER_AMQP_CERT_FILE"] = tc.cert
				h.extra["DISPATCHER_AMQP_KEY_FILE"] = tc.key
			}
			p := h.start()
			want := scheduleSpread(t, h.producer("tlsbad"), "b", 200, time.Now(), 500*time.Millisecond)
			waitLogged(t, p, tc.wantLog, 15*time.Second)
			// Retrying: the failed connects keep counting.
			eventually(t, 10*time.Second, "3 failed broker connects", func() bool {
				n, ok := tryMetric(addr, "dispatcher_broker_connect_errors_total")
				return ok && n >= 3
			})
			if code := readyStatus(addr); code != http.StatusServiceUnavailable {
				t.Errorf("/readyz answered %d without a broker connection", code)
			}
			if !p.running() {
				t.Fatal("dispatcher exited instead of retrying")
			}
			logged := grep(p.out.String(), tc.wantLog)
			t.Logf("logged: %s", logged)
			if n := strings.Count(p.out.String(), tc.wantLog); n != 1 {
				t.Errorf("the TLS error logged %d times, want once", n)
			}
			if strings.Contains(p.out.String(), password) {
				t.Errorf("password in the dispatcher's output")
			}
			if pending, inflight, _ := h.leftovers(h.queues[0]); pending != int64(len(want)) || inflight != 0 {
				t.Errorf("without a broker: %d pending, %d in flight; want all %d pending", pending, inflight, len(want))
			}

			p.signal(syscall.SIGTERM)
			p.wait(15 * time.Second)
			h.extra["DISPATCHER_AMQP_CA_FILE"] = good.CA
			h.extra["DISPATCHER_AMQP_CERT_FILE"] = good.ClientCert
			h.extra["DISPATCHER_AMQP_KEY_FILE"] = good.ClientKey
			h.start()
			h.verify("tlsbad", want, 30*time.Second, 0)
		})
	}
}
