package statuspage

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/instances"
)

// TestRenderIngress: the page has a row per ingress, with its state, the
// ready messages and oldest age this instance knows, the consuming
// instances and the rate and errors of all of them; an ingress that makes
// the instance not ready, or is behind, is said at the top.
func TestRenderIngress(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	d := Data{Instance: "h:1:ab", Refresh: 2, Now: now,
		Ingress: []Ingress{
			{Queue: "orders", Exchange: "orders.delayed", IngressQueue: "dispatcher.ingress.orders", Consuming: true,
				Ready: 12345, Consumers: 2, ReadAt: now.Add(-time.Second), Held: 256, OldestAge: 42 * time.Second,
				Behind: "queue orders: ingress behind: the oldest message not yet in Redis has waited 42s"},
			{Queue: "mail", Exchange: "mail.delayed", IngressQueue: "dispatcher.ingress.mail", Ready: -1,
				Err: "declaring ingress queue <q>", NotReady: "queue mail: ingress not consuming dispatcher.ingress.mail for 40s"},
		},
		Whole: []instances.Queue{{Name: "orders", Records: []instances.Record{
			{ID: "a", SpanMs: 60_000, Ingress: &instances.Ingress{Exchange: "orders.delayed", Consuming: true, Ready: 12345, Ingested: 6000, Errors: map[string]int64{"bad_header": 3}}},
			{ID: "b", SpanMs: 60_000, Ingress: &instances.Ingress{Exchange: "orders.delayed", Consuming: true, Ready: 12000, Ingested: 3000}},
		}}},
	}
	var buf bytes.Buffer
	if err := Render(&buf, d); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(page, "")
	for _, want := range []string{
		"Ingress behind queue orders: ingress behind: the oldest message not yet in Redis has waited 42s",
		"Ingress queue mail: ingress not consuming dispatcher.ingress.mail for 40s",
		"AMQP ingress",
		"ordersorders.delayeddispatcher.ingress.ordersbehind12,34542s2562 (2 of 2 instances)150bad_header 3",
		"mailmail.delayeddispatcher.ingress.mailnot consuming declaring ingress queue &lt;q&gt;&ndash;00&ndash;&ndash;none",
	} {
		if !strings.Contains(strings.ReplaceAll(text, "\n", ""), want) {
			t.Errorf("page lacks %q:\n%s", want, text)
		}
	}
}
