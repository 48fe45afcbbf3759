package tests

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/liveness"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestLivenessNoBrokerTakesNoShare: an instance that cannot reach its
// broker (here: a wrong password) heartbeats fine, but must not keep a
// share of the shards while it can publish nothing: the healthy instance
// sweeps every shard and delivers every task.
func TestLivenessNoBrokerTakesNoShare(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "nb", Shards: 8})
	healthy := h.start()
	waitStarted(t, healthy)

	bad := h.env()
	u, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	bad["DISPATCHER_AMQP_URL"] = u.String()
	broken := start(t, bad)
	// The broken instance's liveness record is there: it heartbeats.
	eventually(t, 15*time.Second, "two liveness records", func() bool {
		return h.rdb.HLen(context.Background(), liveness.Key(h.prefix)).Val() == 2
	})
	time.Sleep(2 * time.Second) // a few heartbeats: shares settled

	// No wake-ups (a producer in another language): only the sweeps of
	// each shard's share find the tasks.
	prod := h.producer("nb")
	prod.SetWakeWithin(0)
	want := scheduleSpread(t, prod, "nb", 40, time.Now().Add(500*time.Millisecond), time.Second)
	// Generous: the lease is 30 s, so a task left to the broken instance's
	// share is not delivered within it.
	got := h.collect("nb", len(want), 20*time.Second)
	ids, _ := countIDs(got)
	if miss := missing(want, ids); len(miss) > 0 {
		t.Errorf("%d of %d tasks not delivered: the instance without a broker kept its share of the shards\nbroken instance:\n%s",
			len(miss), len(want), tail(broken.out.String(), 2000))
	}
}

// TestRedisRestartDeclaresNoOneDead: Redis (with its append-only file, so
// the liveness records survive) is killed for 3 s under traffic served
// by three instances and restarted. Every record is stale when it comes
// back and every instance reconnects in its own time: the first one back
// must not declare the others dead (their hand-backs send what they had
// published unconfirmed twice). Nothing is lost.
func TestRedisRestartDeclaresNoOneDead(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{AOF: true, AppendFsync: "always"})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: "rr", Shards: 8})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	h.extra["DISPATCHER_LEASE"] = "5s" // see TestRedisKilledWithAOF
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "1s"
	procs := []*proc{h.start(), h.start(), h.start()}
	for _, p := range procs {
		waitStarted(t, p)
	}
	f := newFeeder(t, h.producer("rr"), "r", 6*time.Second, 10, "").start()
	o := verifyWhile(h, "rr", f.want, 40*time.Second, len(f.want), func() {
		time.Sleep(2 * time.Second)
		srv.Kill()
		time.Sleep(3 * time.Second)
		srv.Restart()
		srv.WaitLoaded(10 * time.Second)
		f.wait()
	})
	declared := 0
	for _, p := range procs {
		declared += strings.Count(p.out.String(), "instance declared dead")
	}
	t.Logf("REDIS RESTART three instances: duplicates %d, declarations %d, worst %d ms", o.Duplicates, declared, o.WorstLate.Milliseconds())
	if declared > 0 {
		t.Errorf("%d instances declared dead after a Redis restart, none of them was", declared)
	}
}
