package statuspage

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/forecast"
	"github.com/dispatcher/dispatcher/internal/monitor"
	"github.com/dispatcher/dispatcher/internal/queuestate"
)

// TestRenderForecast: the hour ahead as a bar per minute with its axis
// values, the busiest second, and the herd warning at the top and in the
// queue's section; a queue whose hour was not read yet says so.
func TestRenderForecast(t *testing.T) {
	from := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC).UnixMilli()
	f := &forecast.Forecast{Queue: "orders", FromMs: from, StepMs: 60_000, Overdue: 3, Total: 5060,
		Peak: forecast.Peak{FromMs: from + 630_000, Tasks: 5000, Exact: true}}
	for k := range 60 {
		n := int64(1)
		if k == 10 {
			n = 5001
		}
		f.Buckets = append(f.Buckets, forecast.Bucket{FromMs: from + int64(k)*60_000, Tasks: n})
	}
	var buf bytes.Buffer
	err := Render(&buf, Data{Instance: "i", Now: time.UnixMilli(from), Refresh: 2, Queues: []monitor.View{
		{State: queuestate.Queue{Name: "orders"}, Forecast: f, Drain: 100, DrainFrom: "MAX_RATE", HerdLimit: 1000},
		{State: queuestate.Queue{Name: "mail"}, Drain: 1000, DrainFrom: "default DRAIN_RATE", HerdLimit: 10_000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	svg := regexp.MustCompile(`(?s)<svg[^>]*aria-label="forecast of orders">.*?</svg>`).FindString(page)
	if n := strings.Count(svg, "<rect"); n != 60 {
		t.Errorf("%d bars for 60 minutes:\n%s", n, svg)
	}
	for _, want := range []string{`>10,000</text>`, `>0</text>`, `>now</text>`, `>+30m</text>`, `>+1h</text>`,
		`<title>from 2026-11-24 12:10:00.000Z: 5001 tasks</title>`} {
		if !strings.Contains(svg, want) {
			t.Errorf("the forecast picture has no %s:\n%s", want, svg)
		}
	}
	herd := "5,000 tasks fall due in one second at 2026-11-24 12:10:30.000Z; queue orders drains 1,000 in 10 s at 100/s (MAX_RATE)"
	for _, want := range []string{
		"Falling due per minute over the next hour (5,060 tasks; overdue now 3; busiest second: 5,000 tasks at 2026-11-24 12:10:30.000Z)",
		`<span class="warn">Thundering herd ahead</span> on queue <a href="#q-orders">orders</a>: ` + herd,
		`<span class="warn">Thundering herd ahead:</span> ` + herd,
		`aria-label="forecast of mail">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if mail := regexp.MustCompile(`(?s)<svg[^>]*aria-label="forecast of mail">.*?</svg>`).FindString(page); !strings.Contains(mail, "not read yet") {
		t.Errorf("mail's forecast: %s", mail)
	}
}
