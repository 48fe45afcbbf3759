package scanner

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/publisher"
)

// TestCausesNameWhatToFix: a failed publish is described with the exchange
// and routing key it went to and what the broker said; the log names them
// and counts the failures since its last line, once per 10 s per kind; a
// confirm ends the causes of the exchange or channel (not a refusal of one
// message), and a cause not seen within the window is over.
func TestCausesNameWhatToFix(t *testing.T) {
	var log bytes.Buffer
	c := newCauses("tasks", "orders", slog.New(slog.NewTextHandler(&log, nil)).With("queue", "q"), time.Minute)
	t0 := time.Now()
	unroutable := &publisher.ReturnedError{Code: 312, Reason: "NO_ROUTE"}
	tooLarge := &publisher.LostError{Code: 406, Reason: "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000", Refused: true}
	c.published(t0, 0, []error{unroutable, unroutable, unroutable})
	c.published(t0.Add(time.Second), 0, []error{unroutable, unroutable, tooLarge})
	got := c.active(t0.Add(2 * time.Second))
	want := []string{
		`refused as too large: 406 PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000 (exchange "tasks", routing key "orders") (1 failed publishes over 0s, the latest 1s ago)`,
		`unroutable: exchange "tasks" has no queue bound for routing key "orders" (312 NO_ROUTE) (5 failed publishes over 1s, the latest 1s ago)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("active:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `level=WARN msg="publish failed; tasks kept for retry" queue=q exchange=tasks routing_key=orders cause="unroutable: exchange \"tasks\" has no queue bound for routing key \"orders\" (312 NO_ROUTE)" kind=returned tasks=3`) ||
		!strings.Contains(lines[1], "kind=refused tasks=1") {
		t.Errorf("log:\n%s", log.String())
	}
	// 10 s after the first line: the next counts what was held back.
	log.Reset()
	c.published(t0.Add(10*time.Second), 0, []error{unroutable})
	if l := log.String(); !strings.Contains(l, "kind=returned tasks=3") {
		t.Errorf("log after 10 s:\n%s", l)
	}

	// A confirm ends the unroutable cause, not the refusal.
	log.Reset()
	c.published(t0.Add(11*time.Second), 1, nil)
	if got := c.active(t0.Add(11 * time.Second)); len(got) != 1 || !strings.HasPrefix(got[0], "refused as too large") {
		t.Errorf("after a confirm: %q, want only the refusal", got)
	}
	if l := log.String(); !strings.Contains(l, `msg="publishes confirmed again"`) || !strings.Contains(l, "failed_publishes=6") {
		t.Errorf("the end of the cause is not logged:\n%s", l)
	}
	if got := c.active(t0.Add(62 * time.Second)); len(got) != 0 {
		t.Errorf("a cause unseen for longer than the window: %q", got)
	}

	d := newCauses("", "k", slog.New(slog.DiscardHandler), time.Minute)
	if got := d.describe("nack", publisher.ErrNacked); got != `nacked by the broker (exchange "" (the default exchange), routing key "k")` {
		t.Errorf("nack on the default exchange: %q", got)
	}
}
