package tests

import (
	"context"
	"net/url"
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
