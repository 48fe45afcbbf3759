package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

// ingressStatsDoc is the ingress part of `dispatcher stats --json`.
type ingressStatsDoc struct {
	Ingress []struct {
		Queue        string           `json:"queue"`
		Exchange     string           `json:"exchange"`
		IngressQueue string           `json:"ingress_queue"`
		Instances    int              `json:"instances"`
		Consuming    int              `json:"consuming"`
		Ready        *int64           `json:"ready"`
		Oldest       float64          `json:"oldest_message_age_seconds"`
		Rate         float64          `json:"ingested_per_second"`
		Errors       map[string]int64 `json:"errors"`
		NotConsuming []struct {
			ID  string `json:"instance"`
			Err string `json:"error"`
		} `json:"not_consuming"`
	} `json:"ingress"`
}

func ingressStats(t *testing.T, env map[string]string, queue string) ingressStatsDoc {
	t.Helper()
	out, errOut, code := runCLI(t, env, "stats", "--queue", queue, "--json")
	var doc ingressStatsDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("stats --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	return doc
}

// TestIngressSeeBehind: ingest falls behind (Redis 200 ms a round trip
// away, a prefetch of 2) while producers publish with the broker's receive
// time in timestamp_in_ms, as RabbitMQ's interceptor sets it: the ingress
// queue's ready messages and the age of its oldest message show in
// /metrics, on the status page, in /readyz (a line, still 200) and in
// `dispatcher stats`; once Redis is near again the backlog is ingested and
// every figure is back to 0, every message a task.
func TestIngressSeeBehind(t *testing.T) {
	queue := fmt.Sprintf("ings-%d", time.Now().UnixNano()%1_000_000_000)
	h := newHarness(t, queueSpec{Name: queue, Shards: 4})
	np := newNetProxy(t, testenv.HostPort(testenv.RedisURL(t)))
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_REDIS_URL"] = np.url(testenv.RedisURL(t))
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_STALL_AFTER"] = "3s"
	w := newIngressWorldOn(t, h, []string{"k"}, func(qp string) map[string]string {
		return map[string]string{qp + "_INGRESS_PREFETCH": "2"}
	})
	sample := func(name string) string { return fmt.Sprintf("%s{queue=%q}", name, queue) }
	eventually(t, 10*time.Second, "the ingress consuming, its queue read", func() bool {
		return metric(t, addr, sample("dispatcher_ingress_consuming")) == 1 && metric(t, addr, sample("dispatcher_ingress_ready_messages")) == 0
	})
	if a := metric(t, addr, sample("dispatcher_ingress_oldest_message_age_seconds")); a != 0 {
		t.Errorf("oldest message age %v with nothing published", a)
	}

	remove := np.latency(100, 0)
	defer remove()
	const n = 60
	first := time.Now()
	for i := range n {
		w.publish(t, "k", amqp.Publishing{MessageId: fmt.Sprintf("see-%d", i),
			Headers: amqp.Table{"x-delay": int32(3_600_000), ingress.HeaderReceived: time.Now().UnixMilli()}})
	}

	// Behind: the age passes STALL_AFTER while messages are ready.
	var ready, age float64
	eventually(t, 20*time.Second, "the oldest message age over 3s with messages ready", func() bool {
		ready = metric(t, addr, sample("dispatcher_ingress_ready_messages"))
		age = metric(t, addr, sample("dispatcher_ingress_oldest_message_age_seconds"))
		return ready > 0 && age > 3
	})
	// The stamps are whole ms, so up to 1 ms earlier than the time.
	if max := time.Since(first).Seconds() + 0.001; age > max {
		t.Errorf("oldest message age %.3fs, yet the first was published %.3fs ago", age, max)
	}
	t.Logf("behind: %v ready, oldest %.1fs", ready, age)
	var body string
	eventually(t, 10*time.Second, "/readyz 200 saying the ingress is behind", func() bool {
		var code int
		code, body = getStatus(t, "http://"+addr+"/readyz")
		if code != http.StatusOK && !strings.HasPrefix(body, "redis: ") {
			// Redis 200 ms away may miss the probe's 1 s for a PING on
			// a new connection; nothing else may fail it.
			t.Fatalf("/readyz %d while the ingress is only behind:\n%s", code, body)
		}
		return code == http.StatusOK && strings.Contains(body, "queue "+queue+": ingress behind: the oldest message not yet in Redis has waited ")
	})
	if !strings.Contains(body, "over DISPATCHER_STALL_AFTER 3s); ") || !strings.Contains(body, " ready in dispatcher.ingress."+queue+", 1 consumer,") {
		t.Errorf("/readyz behind line:\n%s", body)
	}
	t.Logf("/readyz while behind:\n%s", body)
	page := get(t, "http://"+addr+"/")
	if !strings.Contains(page, `<h2>AMQP ingress</h2>`) || !strings.Contains(page, `<span class="warn">behind</span>`) || !strings.Contains(page, "Ingress behind</span> queue "+queue) {
		t.Errorf("the status page does not show the ingress behind:\n%s", page)
	}
	env := h.env()
	env["DISPATCHER_REDIS_URL"] = testenv.RedisURL(t) // the CLI reads Redis directly
	eventually(t, 15*time.Second, "stats to show the backlog", func() bool {
		d := ingressStats(t, env, queue)
		return len(d.Ingress) == 1 && d.Ingress[0].Ready != nil && *d.Ingress[0].Ready > 0 && d.Ingress[0].Oldest > 0
	})

	// Caught up.
	remove()
	eventually(t, 30*time.Second, "every message ingested", func() bool {
		return metric(t, addr, sample("dispatcher_ingress_ingested_total")) == n
	})
	eventually(t, 10*time.Second, "ready and age back to 0", func() bool {
		return metric(t, addr, sample("dispatcher_ingress_ready_messages")) == 0 && metric(t, addr, sample("dispatcher_ingress_oldest_message_age_seconds")) == 0
	})
	code, body := getStatus(t, "http://"+addr+"/readyz")
	if code != http.StatusOK || strings.Contains(body, "ingress behind") {
		t.Errorf("/readyz after catching up: %d\n%s", code, body)
	}
	eventually(t, 15*time.Second, "stats to show it caught up", func() bool {
		d := ingressStats(t, env, queue)
		if len(d.Ingress) != 1 {
			return false
		}
		in := d.Ingress[0]
		return in.Ready != nil && *in.Ready == 0 && in.Oldest == 0 && in.Consuming == 1 && in.Instances == 1 && in.Exchange == w.e && in.IngressQueue == ingress.QueueName(queue)
	})
	out, _, _ := runCLI(t, env, "stats", "--queue", queue)
	if !strings.Contains(out, "INGRESS") || !strings.Contains(out, ingress.QueueName(queue)) || !strings.Contains(out, "1 of 1") {
		t.Errorf("stats has no ingress row:\n%s", out)
	}
	t.Logf("dispatcher stats:\n%s", out)
	eventually(t, 10*time.Second, "/readyz to say the ingress as a whole", func() bool {
		_, body = getStatus(t, "http://"+addr+"/readyz")
		return strings.Contains(body, fmt.Sprintf("queue %s: ingress %s -> %s: 1 of 1 instance consuming; 0 ready; ingested ", queue, w.e, ingress.QueueName(queue)))
	})
	if p, _, _ := h.leftovers(h.queues[0]); p != n {
		t.Errorf("%d tasks pending, want %d", p, n)
	}
}

// TestIngressSeeNotConsuming: the ingress queue replaced by one of another
// type (a classic queue where the setting says quorum): the instance
// cannot consume it. Its metric says so at once; after STALL_AFTER its
// /readyz is 503 naming the cause, and `dispatcher stats` names the
// instance; once the queue is gone it consumes again and is ready.
func TestIngressSeeNotConsuming(t *testing.T) {
	queue := fmt.Sprintf("ingn-%d", time.Now().UnixNano()%1_000_000_000)
	h := newHarness(t, queueSpec{Name: queue, Shards: 4})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_STALL_AFTER"] = "2s"
	w := newIngressWorldOn(t, h, []string{"k"}, nil)
	consuming := fmt.Sprintf("dispatcher_ingress_consuming{queue=%q}", queue)
	eventually(t, 10*time.Second, "the ingress consuming", func() bool { return metric(t, addr, consuming) == 1 })

	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	iq := ingress.QueueName(queue)
	if _, err := ch.QueueDelete(iq, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(iq, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the metric to say it does not consume", func() bool { return metric(t, addr, consuming) == 0 })
	if r := metric(t, addr, fmt.Sprintf("dispatcher_ingress_ready_messages{queue=%q}", queue)); r != -1 {
		t.Errorf("ready messages %v exported while not consuming", r)
	}
	var body string
	eventually(t, 10*time.Second, "/readyz 503 naming the ingress", func() bool {
		var code int
		code, body = getStatus(t, "http://"+addr+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "queue "+queue+": ingress not consuming "+iq+" for ")
	})
	if !strings.Contains(body, "declaring ingress queue") || !strings.Contains(body, config.QueuePrefix(queue)+"_INGRESS_QUEUE_TYPE") {
		t.Errorf("/readyz does not say why:\n%s", body)
	}
	env := h.env()
	eventually(t, 15*time.Second, "stats to name the instance not consuming", func() bool {
		d := ingressStats(t, env, queue)
		return len(d.Ingress) == 1 && d.Ingress[0].Consuming == 0 && len(d.Ingress[0].NotConsuming) == 1 && d.Ingress[0].Ready == nil &&
			strings.Contains(d.Ingress[0].NotConsuming[0].Err, "declaring ingress queue") && d.Ingress[0].NotConsuming[0].ID != ""
	})
	out, _, _ := runCLI(t, env, "stats", "--queue", queue)
	if !strings.Contains(out, "0 of 1") || !strings.Contains(out, "does not consume "+iq+": ") {
		t.Errorf("stats while not consuming:\n%s", out)
	}
	t.Logf("/readyz:\n%s\ndispatcher stats:\n%s", body, out)
	page := get(t, "http://"+addr+"/")
	if !strings.Contains(page, `<span class="bad" title="`) || !strings.Contains(page, ">not consuming</span>") {
		t.Errorf("status page while not consuming:\n%s", page)
	}

	if _, err := ch.QueueDelete(iq, false, false, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "/readyz 200 again", func() bool {
		code, _ := getStatus(t, "http://"+addr+"/readyz")
		return code == http.StatusOK && metric(t, addr, consuming) == 1
	})
	w.publish(t, "k", amqp.Publishing{MessageId: "after", Headers: amqp.Table{"x-delay": int32(100)}})
	w.receive(t, 1, 15*time.Second)
}
