package tests

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// startSweeperThenOther starts two instances of h's queue q, each serving
// the status page: the first holds the sweeper role before the second
// starts. It returns both and their addresses and ids.
func startSweeperThenOther(t *testing.T, h *harness, q string) (sweeper, other *proc, sweeperAddr, otherAddr, sweeperID string) {
	t.Helper()
	ctx := context.Background()
	sweeperAddr, otherAddr = testenv.FreeAddr(t), testenv.FreeAddr(t)
	env := h.env()
	env["DISPATCHER_HTTP_ADDR"] = sweeperAddr
	sweeper = start(t, env)
	k := shard.Keys{Prefix: h.prefix, Queue: q}
	eventually(t, 15*time.Second, "the first instance to take the sweeper role", func() bool {
		id, err := h.rdb.Get(ctx, k.Sweeper()).Result()
		sweeperID = id
		return err == nil && strings.Contains(id, ":"+strconv.Itoa(sweeper.cmd.Process.Pid)+":")
	})
	env = h.env()
	env["DISPATCHER_HTTP_ADDR"] = otherAddr
	other = start(t, env)
	waitLogged(t, sweeper, "broker connected", 15*time.Second)
	waitLogged(t, other, "broker connected", 15*time.Second)
	return
}

// TestStatusPageWholeQueue: two instances serve one queue with traffic
// flowing; the page of the one that does not sweep it, in Chromium,
// shows both instances, the other as the sweeper, and the queue's
// publish rate across them, not its own nothing; its /readyz says the
// same. When the sweeper is killed, its record stays until it expires
// (TTL after its last write), then it drops off the page and /readyz.
func TestStatusPageWholeQueue(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	h := newHarness(t, queueSpec{Name: "orders", Shards: 8})
	sweeper, other, _, addr, sweeperID := startSweeperThenOther(t, h, "orders")
	otherID := "" // read from the page below

	want := scheduleSpread(t, h.producer("orders"), "w", 600, time.Now().Add(time.Second), 6*time.Second)
	got := h.collect("orders", len(want), 30*time.Second)
	if ids, _ := countIDs(got); len(ids) != len(want) {
		t.Fatalf("%d of %d tasks arrived", len(ids), len(want))
	}

	step, _ := openPage(t, addr, "#q-orders")
	var whole, rows string
	// The sweeper's record carries what it published at its next write,
	// within 5 s; the page reloads itself every 2 s meanwhile.
	rate := regexp.MustCompile(`All instances \(2\): published ([0-9.]+)/s`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		whole = evalRetry(t, step, `document.querySelector('#q-orders .whole').innerText`)
		rows = evalRetry(t, step, `Array.from(document.querySelectorAll('#instances tr')).map(r => r.innerText).join('\n')`)
		if m := rate.FindStringSubmatch(whole); m != nil && m[1] != "0.00" || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("the other instance's page:\n%s\n%s", whole, rows)
	m := rate.FindStringSubmatch(whole)
	if r, _ := strconv.ParseFloat(firstOr(m, 1), 64); r <= 0 {
		t.Errorf("the page of the instance that does not sweep does not show the queue's publish rate across both instances:\n%s", whole)
	}
	if !strings.Contains(whole, "swept by "+sweeperID) {
		t.Errorf("the page does not name the sweeper %s:\n%s", sweeperID, whole)
	}
	lines := strings.Split(rows, "\n")
	if len(lines) != 3 || !strings.Contains(rows, sweeperID) || !strings.Contains(rows, "(this one)") {
		t.Fatalf("the instances table, want a header and both instances:\n%s", rows)
	}
	for _, l := range lines[1:] {
		if strings.Contains(l, "(this one)") {
			otherID = strings.Fields(l)[0]
			if !strings.Contains(otherID, ":"+strconv.Itoa(other.cmd.Process.Pid)+":") {
				t.Errorf("this instance's row %q does not carry its pid %d", l, other.cmd.Process.Pid)
			}
		} else if f := strings.Split(l, "\t"); len(f) < 5 || f[4] != "orders" {
			t.Errorf("the sweeper's row does not say it sweeps orders: %q", l)
		}
	}
	// The green line of what all instances published rises above zero.
	pts := evalRetry(t, step, `document.querySelector('svg[aria-label="published per second by orders"] polyline[stroke="#17702b"]').getAttribute('points')`)
	if !risesAboveZero(pts) {
		t.Errorf("the queue's publish picture stays at zero: %q", pts)
	}
	code, body := readyz(addr)
	if code != http.StatusOK || !regexp.MustCompile(`queue orders: 2 live instances, swept by `+regexp.QuoteMeta(sweeperID)+`; published [0-9.]*[1-9][0-9.]*/s`).MatchString(body) ||
		!strings.Contains(body, "instance "+sweeperID+": ") || !strings.Contains(body, "(this one)") {
		t.Errorf("/readyz of the instance that does not sweep: %d\n%s", code, body)
	}

	// Killed: no clean stop removes its record; it goes when it expires.
	sweeper.signal(syscall.SIGKILL)
	<-sweeper.done
	killed := time.Now()
	if _, body := readyz(addr); !strings.Contains(body, "instance "+sweeperID+": ") {
		t.Errorf("the killed instance's record went before it expired:\n%s", body)
	}
	eventually(t, instances.TTL+instances.Every+15*time.Second, "the killed instance to drop off /readyz", func() bool {
		_, body = readyz(addr)
		return strings.Contains(body, "queue orders: 1 live instance, swept by "+otherID)
	})
	gone := time.Since(killed)
	if strings.Contains(body, sweeperID) {
		t.Errorf("/readyz still names the killed instance:\n%s", body)
	}
	if gone < instances.TTL-instances.Every {
		t.Errorf("the killed instance dropped off after %s, before its record could expire (TTL %s)", gone, instances.TTL)
	}
	eventually(t, 10*time.Second, "the killed instance to drop off the page", func() bool {
		rows = evalRetry(t, step, `Array.from(document.querySelectorAll('#instances tr')).map(r => r.innerText).join('\n')`)
		return !strings.Contains(rows, sweeperID) && strings.Count(rows, "\n") == 1
	})
	t.Logf("the killed instance dropped off after %s; the table then:\n%s", gone.Round(100*time.Millisecond), rows)
}

// TestPausedOnEveryReadyz: a paused queue shows on /readyz of an instance
// that does not sweep it (from the sweeper's record), which stays ready;
// the sweeping instance logs the pause and the resume once each.
func TestPausedOnEveryReadyz(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "hold", Shards: 4})
	sweeper, _, _, addr, _ := startSweeperThenOther(t, h, "hold")
	env := h.env()
	if out, errOut, code := runCLI(t, env, "pause", "--queue", "hold"); code != 0 {
		t.Fatalf("pause: exit %d %q %q", code, out, errOut)
	}
	var code int
	var body string
	eventually(t, 30*time.Second, "/readyz of the other instance to say the queue is paused", func() bool {
		code, body = readyz(addr)
		return strings.Contains(body, "queue hold: paused (4 shards): nothing is claimed until `dispatcher resume --queue hold`")
	})
	if code != http.StatusOK {
		t.Errorf("/readyz answered %d for a paused queue, want 200 (paused on purpose):\n%s", code, body)
	}
	waitLogged(t, sweeper, `msg="queue paused: no instance claims its tasks until `+"`dispatcher resume`"+`" component=watchdog queue=hold paused_shards=4`, 10*time.Second)
	if _, _, code := runCLI(t, env, "resume", "--queue", "hold"); code != 0 {
		t.Fatalf("resume: exit %d", code)
	}
	waitLogged(t, sweeper, `msg="queue resumed: its tasks are claimed again" component=watchdog queue=hold`, 15*time.Second)
	eventually(t, 30*time.Second, "/readyz of the other instance to stop saying paused", func() bool {
		_, body = readyz(addr)
		return strings.Contains(body, "queue hold: 2 live instances") && !strings.Contains(body, "paused")
	})
	time.Sleep(3 * time.Second) // more reads of the resumed queue: still one line each
	// The watchdog's lines: the scanner's own "queue paused: claiming
	// nothing" comes at claims (pause wakes the queue, which then claims).
	log := sweeper.out.String()
	if n, m := strings.Count(log, `msg="queue paused: no instance claims`), strings.Count(log, `msg="queue resumed`); n != 1 || m != 1 {
		t.Errorf("the sweeper logged the pause %d times and the resume %d times, want once each:\n%s", n, m, log)
	}
}

// evalRetry evaluates js on the page, retrying while a reload is under way.
func evalRetry(t *testing.T, step context.Context, js string) string {
	t.Helper()
	var err error
	for try := 0; try < 10; try++ {
		var v string
		if v, err = evalJS(step, js); err == nil {
			return v
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: %v", js, err)
	return ""
}

// risesAboveZero reports whether an SVG polyline of the 80-high charts
// has a point above the baseline.
func risesAboveZero(points string) bool {
	for _, p := range strings.Fields(points) {
		if _, y, ok := strings.Cut(p, ","); ok {
			if v, err := strconv.ParseFloat(y, 64); err == nil && v < 80 {
				return true
			}
		}
	}
	return false
}

func firstOr(m []string, i int) string {
	if len(m) > i {
		return m[i]
	}
	return ""
}

func evalJS(step context.Context, js string) (string, error) {
	return chromedp.Run(step, chromedp.Evaluate[string](js))
}
