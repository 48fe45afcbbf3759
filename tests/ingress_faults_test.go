package tests

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

// Fault tests of the AMQP ingress under steady traffic: a producer written
// as a plugin user writes it (x-delay, a message_id per message, publisher
// confirms, nacked publishes sent again) publishes at a steady rate while
// an instance is killed or a RabbitMQ node is lost.

// ingressDelay is the x-delay of message i of these tests: 0 (due at its
// ingest) for one in four, 1 to 4 s for the others.
func ingressDelay(i int) int32 {
	if i%4 == 0 {
		return 0
	}
	return int32(1000 + i*7919%3001)
}

// ingressTraffic is what a steady producer published.
type ingressTraffic struct {
	n int
	// minDue is, per message_id, its first publish time plus its x-delay
	// (ms, this machine's clock, which is Redis's): the earliest due time
	// the ingress may give it, its base being the time of ingest.
	minDue      map[string]int64
	delay       map[string]int32
	republished int           // publishes nacked, sent again
	rate        float64       // achieved, messages/s
	confirmed   time.Duration // from the last publish to the last confirm
}

// publishSteady publishes n = rate × span messages "<tag>-<i>" to exchange
// e with key at a steady rate, each with a message_id and x-delay
// ingressDelay(i) (an int32, as the Java client's Integer), on a channel
// in confirm mode; then it waits for every confirm and publishes a nacked
// message again until it is confirmed. It reports what it could not do
// with t.Errorf.
func publishSteady(t *testing.T, conn *amqp.Connection, e, key, tag string, rate int, span time.Duration) *ingressTraffic {
	n := int(int64(rate) * int64(span) / int64(time.Second))
	tr := &ingressTraffic{n: n, minDue: make(map[string]int64, n), delay: make(map[string]int32, n)}
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("producer channel: %v", err)
		return tr
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Errorf("producer confirm mode: %v", err)
		return tr
	}
	pending := make(map[int]*amqp.DeferredConfirmation, n)
	publish := func(i int) bool {
		id := fmt.Sprintf("%s-%d", tag, i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), e, key, false, false, amqp.Publishing{
			MessageId: id, Body: []byte(fmt.Sprint(i)), ContentType: "text/plain", DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"x-delay": ingressDelay(i)}})
		if err != nil {
			t.Errorf("publish %s: %v", id, err)
			return false
		}
		pending[i] = dc
		return true
	}
	began := time.Now()
	for i := 0; i < n; {
		// Catch up with the schedule, then sleep a tick.
		for due := int(float64(rate) * time.Since(began).Seconds()); i < n && i <= due; i++ {
			id := fmt.Sprintf("%s-%d", tag, i)
			tr.minDue[id], tr.delay[id] = time.Now().UnixMilli()+int64(ingressDelay(i)), ingressDelay(i)
			if !publish(i) {
				return tr
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	last := time.Now()
	tr.rate = float64(n) / last.Sub(began).Seconds()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(pending) > 0 {
		var nacked []int
		for i, dc := range pending {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				t.Errorf("%d publishes unconfirmed 60 s after the last: %v", len(pending), err)
				return tr
			}
			if !ok {
				nacked = append(nacked, i)
			}
		}
		clear(pending)
		slices.Sort(nacked)
		for _, i := range nacked {
			tr.republished++
			if !publish(i) {
				return tr
			}
		}
	}
	tr.confirmed = time.Since(last)
	return tr
}

// ingressFigures are what a consumer of the queue's exchange saw of a
// steady producer's messages.
type ingressFigures struct {
	Delivered, Missing, Deliveries int
	// Duplicates are deliveries of a message_id after its first. SameTask:
	// with the x-due-ms of the first (one task published again: at least
	// once). The others carry another x-due-ms: the message became a
	// second task, ingested again (its due time from the second ingest)
	// after its first task had been claimed, so that the second write did
	// not replace it; TwoTasksDueNow are those of x-delay 0, TwoTasks
	// those of 1 s or more. Redelivery is the longest time between the
	// first ingest of a message and the second that made a second task.
	SameTask, TwoTasksDueNow, TwoTasks int
	Redelivery                         time.Duration
	// Early: received before its x-due-ms, or an x-due-ms before its
	// publish time plus its x-delay. NoDue: without x-due-ms.
	Early, NoDue int
	// Foreign: deliveries whose headers are not those the producer sent
	// (x-delay) plus the dispatcher's own.
	Foreign   int
	WorstLate time.Duration // receipt minus x-due-ms
	// The ingest lag, x-due-ms minus publish time and x-delay: how long
	// after its publish the ingress took the message in.
	LagP50, LagP99, LagMax time.Duration
}

func (f ingressFigures) String() string {
	return fmt.Sprintf("delivered=%d missing=%d deliveries=%d duplicates=%d (one task published again %d; a second task, ingested again after the first was claimed: x-delay 0 %d, x-delay 1-4s %d, up to %d ms after the first ingest) early=%d no_due=%d foreign_headers=%d worst_late_ms=%d ingest_lag_ms p50=%d p99=%d max=%d",
		f.Delivered, f.Missing, f.Deliveries, f.SameTask+f.TwoTasksDueNow+f.TwoTasks, f.SameTask, f.TwoTasksDueNow, f.TwoTasks,
		f.Redelivery.Milliseconds(), f.Early, f.NoDue, f.Foreign, f.WorstLate.Milliseconds(), f.LagP50.Milliseconds(), f.LagP99.Milliseconds(), f.LagMax.Milliseconds())
}

// ingressLookahead is DISPATCHER_LOOKAHEAD's default: a task is claimed
// (and from then on a write of its id schedules another) at most this
// long before its due time.
const ingressLookahead = 100 * time.Millisecond

// ingressOutcome counts got against what tr published, and fails the test
// for a message missing, early, without x-due-ms or with headers the
// producer did not send, or made a second task while its first was still
// pending.
//
// A message ingested, then delivered to the ingress again (an instance
// killed between its write and its ack, an ack lost with a RabbitMQ node)
// becomes one task if its first task is still pending when it is ingested
// again: the write by its message_id replaces it. If the first task was
// claimed by then (its due time was within the lookahead: x-delay 0, or
// shorter than the redelivery took), the second write makes a second task,
// and the consumer gets both: those are counted and reported, not failed.
// A second task whose second ingest (its x-due-ms minus its x-delay) came
// more than a second before its first task could be claimed fails the
// test: the second is the slack for the time between the ingress reading
// the Redis clock for its batch and writing it.
func ingressOutcome(t *testing.T, tr *ingressTraffic, got []received) ingressFigures {
	t.Helper()
	var f ingressFigures
	firstDue := map[string]int64{}
	var lags []time.Duration
	for _, r := range got {
		id := r.d.MessageId
		minDue, ok := tr.minDue[id]
		if !ok {
			t.Errorf("delivered a message_id never published: %q", id)
			continue
		}
		f.Deliveries++
		foreign := r.d.Headers["x-delay"] != tr.delay[id]
		for k := range r.d.Headers {
			foreign = foreign || (k != "x-delay" && !dispatcherHeaders[k])
		}
		if foreign {
			if f.Foreign++; f.Foreign <= 3 {
				t.Errorf("%s: headers %v, want x-delay %d and the dispatcher's", id, r.d.Headers, tr.delay[id])
			}
		}
		due, ok := r.d.Headers["x-due-ms"].(int64)
		if !ok {
			f.NoDue++
			continue
		}
		if first, seen := firstDue[id]; seen {
			if due == first {
				f.SameTask++
				continue
			}
			if tr.delay[id] == 0 {
				f.TwoTasksDueNow++
			} else {
				f.TwoTasks++
			}
			again := due - int64(tr.delay[id]) // the second ingest, Redis clock
			f.Redelivery = max(f.Redelivery, time.Duration(due-first)*time.Millisecond)
			if claimable := first - ingressLookahead.Milliseconds(); again < claimable-1000 {
				t.Errorf("%s (x-delay %d) became a second task while its first was pending: x-due-ms %d, then %d (ingested again at %d, %d ms before the first could be claimed)",
					id, tr.delay[id], first, due, again, claimable-again)
			}
			continue
		}
		firstDue[id] = due
		// 2 ms: the consumer's clock reading and x-due-ms are both ms.
		if r.at.UnixMilli() < due-2 || due < minDue-2 {
			if f.Early++; f.Early <= 5 {
				t.Errorf("%s early: published+delay %d, x-due-ms %d, received %d", id, minDue, due, r.at.UnixMilli())
			}
		}
		f.WorstLate = max(f.WorstLate, r.at.Sub(time.UnixMilli(due)))
		lags = append(lags, time.Duration(due-minDue)*time.Millisecond)
	}
	f.Delivered = len(firstDue)
	var miss []string
	for id := range tr.minDue {
		if _, ok := firstDue[id]; !ok {
			miss = append(miss, id)
		}
	}
	slices.Sort(miss)
	f.Missing = len(miss)
	if len(lags) > 0 {
		slices.Sort(lags)
		f.LagP50, f.LagP99, f.LagMax = lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1]
	}
	if f.Missing > 0 {
		t.Errorf("%d of %d messages never arrived, e.g. %.10v", f.Missing, tr.n, miss)
	}
	if f.Early > 0 || f.NoDue > 0 || f.Foreign > 0 {
		t.Errorf("%d deliveries early, %d without x-due-ms, %d with headers the producer did not send", f.Early, f.NoDue, f.Foreign)
	}
	return f
}

// ingressQueueDepth is the number of ready messages in queue's ingress
// queue, -1 if it cannot be read.
func ingressQueueDepth(conn *amqp.Connection, queue string) int {
	ch, err := conn.Channel()
	if err != nil {
		return -1
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(ingress.QueueName(queue), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		return -1
	}
	return q.Messages
}

// TestIngressKillUnderSteadyTraffic: three instances serve the queue with
// the ingress on; a producer publishes 2,000 messages/s for 12 s (x-delay
// 0 for one in four, 1 to 4 s for the others), and 5 s in the instance
// holding the most claims is killed (SIGKILL), with ingress deliveries
// unacked (its prefetch window), some maybe written to Redis already, and
// claimed tasks. Its unacked deliveries go to the other two. Nothing is
// missing, nothing early, the headers are the producer's, and a message
// redelivered to the ingress makes no second task while its first is
// pending (see ingressOutcome for those of x-delay 0). Duplicates are
// counted and logged: tasks the killed instance published and had not
// acked in Redis (one x-due-ms), and second tasks.
func TestIngressKillUnderSteadyTraffic(t *testing.T) {
	const rate, span = 2000, 12 * time.Second
	w := newIngressWorld(t, nil, nil)
	h, queue := w.h, w.queue
	procs := []*proc{w.proc, h.start(), h.start()}
	for _, p := range procs[1:] {
		waitStarted(t, p)
	}
	var tr *ingressTraffic
	var killed *proc
	depth := -1
	var wg sync.WaitGroup
	wg.Go(func() { tr = publishSteady(t, h.conn, w.e, h.queues[0].RoutingKey, "k", rate, span) })
	wg.Go(func() {
		time.Sleep(5 * time.Second)
		if killed = h.worker(h.queues[0], procs); killed == nil {
			killed = procs[0]
		}
		killed.signal(syscall.SIGKILL)
		depth = ingressQueueDepth(h.conn, queue)
	})
	got := h.collect(queue, rate*int(span/time.Second), span+60*time.Second)
	wg.Wait()
	if killed.wait(10*time.Second) == 0 {
		t.Fatal("the instance was not killed")
	}
	f := ingressOutcome(t, tr, got)
	t.Logf("INGRESS kill: %d/s for %s (achieved %.0f/s; last confirm %s after the last publish; %d nacked, sent again), 3 instances, one SIGKILLed at +5s (ingress queue ready right after: %d): published=%d %s",
		rate, span, tr.rate, tr.confirmed.Round(time.Millisecond), tr.republished, depth, tr.n, f)
	for _, p := range procs {
		if p != killed && !p.running() {
			t.Errorf("a surviving instance exited:\n%s", tail(p.out.String(), 2000))
		}
	}
	h.emptyAtEnd(h.queues[0])
	if d := ingressQueueDepth(h.conn, queue); d != 0 {
		t.Errorf("ingress queue holds %d messages at the end", d)
	}
}

// TestIngressClusterNodeLost: the ingress queue is a quorum queue on a
// 3-node RabbitMQ cluster (pause_minority). The dispatcher, its ingress
// and its publisher, is on the node that leads the ingress queue (it
// declared it there), the producer and the consumer on another. A
// producer publishes 1,000 messages/s for 10 s, and 4 s in that node is
// killed (SIGKILL): the quorum queue elects a leader among the two left,
// the producer's publishes are confirmed (or nacked and sent again), the
// ingress consumes again through the next node and gets again what it had
// not acked, and what it had acked but the lost leader had not committed.
// Nothing is lost, nothing early; duplicates are counted and logged as in
// TestIngressKillUnderSteadyTraffic.
func TestIngressClusterNodeLost(t *testing.T) {
	const rate, span = 1000, 10 * time.Second
	c := testenv.SharedRabbitCluster(t)
	r := newClusterRun(t, c, "ingclu")
	h, q := r.h, r.h.queues[0]
	victim, other := c.Nodes[0], c.Nodes[1]
	e := h.prefix + ".ingress"
	h.extra[config.QueuePrefix(q.Name)+"_INGRESS_EXCHANGE"] = e
	h.extra["DISPATCHER_AMQP_URL"] = strings.Join(append([]string{victim.AMQPURL()}, c.URLs()[1:]...), ",")
	h.extra["DISPATCHER_AMQP_NODE_ORDER"] = "listed"
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			conn, err := n.Dial()
			if err != nil {
				continue
			}
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(ingress.QueueName(q.Name), false, false, false)
				_ = ch.ExchangeDelete(e, false, false)
			}
			conn.Close()
			return
		}
	})
	r.start(t)
	waitLogged(t, r.p, "ingress: consuming", 30*time.Second)
	leader, err := c.QueueLeader(ingress.QueueName(q.Name))
	if err != nil {
		t.Fatal(err)
	}
	at := testenv.HostPort(victim.AMQPURL())
	if leader != victim || r.node(t) != at {
		t.Fatalf("ingress queue led by %s, dispatcher on %s: want both on %s", leader.Name, r.node(t), victim.Name)
	}
	conn, err := other.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var tr *ingressTraffic
	var lost time.Time
	var wg sync.WaitGroup
	began := time.Now()
	wg.Go(func() { tr = publishSteady(t, conn, e, q.RoutingKey, "c", rate, span) })
	wg.Go(func() {
		time.Sleep(4 * time.Second)
		lost = time.Now()
		victim.Crash()
	})
	got := h.collect(q.Name, rate*int(span/time.Second), span+60*time.Second)
	wg.Wait()
	f := ingressOutcome(t, tr, got)
	newLeader, err := c.QueueLeader(ingress.QueueName(q.Name))
	leaderName := fmt.Sprint(err)
	if err == nil {
		leaderName = newLeader.Name
	}
	t.Logf("INGRESS cluster node lost: %d/s for %s (achieved %.0f/s; last confirm %s after the last publish; %d nacked, sent again), node %s (ingress queue leader, dispatcher's node) killed at +%s; ingress queue now led by %s, dispatcher on %s, ingress reconnects %d: published=%d %s",
		rate, span, tr.rate, tr.confirmed.Round(time.Millisecond), tr.republished, victim.Name, lost.Sub(began).Round(time.Millisecond),
		leaderName, r.node(t), strings.Count(r.p.out.String(), "ingress: consuming stopped"), tr.n, f)
	drained(t, h, r.p)
	if d := ingressQueueDepth(conn, q.Name); d != 0 {
		t.Errorf("ingress queue holds %d messages at the end", d)
	}
}
