package tests

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// browser starts Debian's headless Chromium for one test. It is installed
// by scripts/dev.sh test; a machine without it fails the test rather than
// skipping it, so that a page nobody looked at does not pass.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: run scripts/dev.sh test, which installs Debian's chromium package")
	}
	dir := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(dir),
		chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1200, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		// Chromium's children may still write there for a moment.
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// The first Run starts the browser, which lives as long as ctx: no
	// timeout on it (later steps get theirs).
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`1`)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// TestStatusPage opens the status page in a real headless Chromium and
// checks what a person sees: the queue's figures, a broken shard named
// with its key while the other shards show, the broker and Redis state
// without passwords, the pictures, and that the page refreshes itself.
// DISPATCHER_TEST_SCREENSHOT=<file> also saves a screenshot there (that is
// how docs/status-page.png is made).
func TestStatusPage(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, queueSpec{Name: "orders", Shards: 16}, queueSpec{Name: "mail", Shards: 4})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_STATS_INTERVAL"] = "1s"
	// A queue taken to drain 0.1 task a second: any second ahead holding
	// 2 tasks is a herd (the tasks scheduled below come 6 or 7 at a time).
	h.extra["DISPATCHER_QUEUE_ORDERS_DRAIN_RATE"] = "0.1"
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)

	// Work for the page to show: tasks over the next hour, some going out
	// now (the lateness picture), a dead letter, and a broken shard 5.
	k := shard.Keys{Prefix: h.prefix, Queue: "orders"}
	h.rdb.Set(ctx, k.Pending(5), "not a sorted set", 0)
	prod := h.producer("orders")
	later, now := 0, 0
	for i := 0; later < 400; i++ {
		m := []byte(fmt.Sprint("task-", i))
		if shard.Index(m, 16) == 5 {
			continue
		}
		due := time.Now().Add(time.Duration(1+i%60) * time.Minute)
		if i%4 == 0 && now < 50 {
			due = time.Now().Add(500 * time.Millisecond)
			now++
		} else {
			later++
		}
		if err := prod.Schedule(ctx, m, due); err != nil {
			t.Fatal(err)
		}
	}
	h.rdb.ZAdd(ctx, k.Dead(2), redis.Z{Score: 1, Member: "1:poison"})
	h.collect("orders", now, 15*time.Second)
	time.Sleep(3 * time.Second) // a few samples for the age picture
	// A second instance, started after the traffic (so that the first's
	// figures are the queue's): the page lists both.
	delete(h.extra, "DISPATCHER_HTTP_ADDR")
	second := h.start()
	waitLogged(t, second, "broker connected", 15*time.Second)
	eventually(t, 3*instances.Every, "the second instance's record", func() bool {
		return len(instances.Read(ctx, h.rdb, h.prefix, []string{"orders"}, instances.TTL)[0].Records) == 2
	})

	step, eval := openPage(t, addr, "#q-orders")
	text := eval(`document.body.innerText`)
	backlogBars := eval(`String(document.querySelectorAll('svg[aria-label="backlog per shard of orders"] rect').length)`)
	latenessBars := eval(`String(document.querySelectorAll('svg[aria-label="dispatch lateness of orders"] rect').length)`)
	forecastBars := eval(`String(Array.from(document.querySelectorAll('svg[aria-label="forecast of orders"] rect')).filter(r => r.getAttribute('height') !== '0.0').length)`)
	forecastAxis := eval(`Array.from(document.querySelectorAll('svg[aria-label="forecast of orders"] text.axis')).map(e => e.textContent).join('|')`)
	refresh := eval(`document.querySelector('meta[http-equiv="refresh"]').content`)
	row := func(name string) string {
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, name+"\t") {
				return l
			}
		}
		return ""
	}
	orders := strings.Split(row("orders"), "\t")
	// queue, state, pending, due, in flight, expired, dead, retried,
	// oldest retried age, age, next due, broken, swept by
	if len(orders) != 13 || orders[2] != "400" || orders[6] != "1" || orders[7] != "0" || orders[11] != "1" || orders[12] != "this instance" {
		t.Errorf("orders row as shown: %q", orders)
	}
	if mail := strings.Split(row("mail"), "\t"); len(mail) != 13 || mail[2] != "0" || mail[1] != "on time" {
		t.Errorf("mail row as shown: %q", mail)
	}
	for _, want := range []string{
		"Queue orders", "Queue mail",
		"Broker\tconnected", "reachable",
		"WRONGTYPE key " + k.Pending(5) + " holds a string, not a sorted set",
		"Backlog per shard (16 shards",
		"Falling due per minute over the next hour (400 tasks; overdue now 0; busiest second: ",
		"Thundering herd ahead on queue orders: ", "queue orders drains 1 in 10 s at 0.10/s (DRAIN_RATE)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q:\n%s", want, text)
		}
	}
	// The lateness picture is the queue's over the last minute (this
	// test takes well under one): the tasks above, all by this instance.
	if !regexp.MustCompile(`Dispatch lateness, all instances, over the last [0-9.]+s \(` + fmt.Sprint(now) + ` tasks\)`).MatchString(text) {
		t.Errorf("the lateness picture does not count the %d tasks dispatched:\n%s", now, text)
	}
	if !regexp.MustCompile(`All instances \(2\): published [0-9.]+/s over the last [0-9.ms]+ \(` + fmt.Sprint(now) + ` tasks\)`).MatchString(text) {
		t.Errorf("the queue as a whole is not shown with both instances and the %d tasks:\n%s", now, text)
	}
	if rows := eval(`String(document.querySelectorAll('#instances tr').length)`); rows != "3" {
		t.Errorf("the instances table has %s rows, want a header and both instances", rows)
	}
	if strings.Contains(text, "guest:guest") || !strings.Contains(text, "guest:xxxxx@") {
		t.Errorf("the page shows the broker's password, or no redacted URL:\n%s", text)
	}
	if n, _ := strconv.Atoi(backlogBars); n < 16 || latenessBars == "0" {
		t.Errorf("pictures: %s backlog bars for 16 shards, %s lateness bars", backlogBars, latenessBars)
	}
	// 400 tasks over minutes 1 to 60 ahead: at least 58 bars of the 60
	// (the hour is read from a whole second, minute 60's tasks at its edge).
	if n, _ := strconv.Atoi(forecastBars); n < 58 || forecastAxis != "8|0|now|+30m|+1h" && forecastAxis != "10|0|now|+30m|+1h" {
		t.Errorf("forecast picture: %s bars with tasks, axes %q", forecastBars, forecastAxis)
	}
	if refresh == "" {
		t.Error("the page does not refresh itself")
	}
	// It does reload: the document's time origin changes. A reload may be
	// under way when asked, so each look is retried.
	origin := func() string {
		t.Helper()
		for try := 0; ; try++ {
			v, err := chromedp.Run(step, chromedp.Evaluate[string](`String(performance.timeOrigin)`))
			if err == nil || try == 5 {
				if err != nil {
					t.Fatalf("performance.timeOrigin: %v", err)
				}
				return v
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	first := origin()
	time.Sleep(3500 * time.Millisecond)
	if again := origin(); again == first {
		t.Errorf("the page did not reload within 3.5 s (refresh %q s)", refresh)
	}
	if err := chromedp.Do(step, chromedp.WaitVisible(chromedp.CSS("#q-orders"))); err != nil {
		t.Fatal(err)
	}

	shot, err := chromedp.Run(step, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() < 800 {
		t.Fatalf("screenshot: %v", err)
	}
	if dst := os.Getenv("DISPATCHER_TEST_SCREENSHOT"); dst != "" {
		if err := os.WriteFile(dst, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot saved to %s", dst)
	} else {
		_ = os.WriteFile(filepath.Join(t.TempDir(), "status.png"), shot, 0o644)
	}

	// Read-only: no method but GET and HEAD.
	resp, err := httpClient.Post("http://"+addr+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("POST / answered %d, want 405", resp.StatusCode)
	}
}

// TestStatusPageFreshnessAxesThroughput: what the page says about how old
// its figures are and how fast the queue moves, as a person sees it in
// Chromium: each queue says when its figures were read (a quiet queue's
// can be several seconds older than the page), the pictures have values
// on their axes, and the queue shows what this instance published per
// second and the errors it met.
func TestStatusPageFreshnessAxesThroughput(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, queueSpec{Name: "fresh", Shards: 4})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_STATS_INTERVAL"] = "1s"
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	// A broken shard makes errors (wrongtype) on every sweep; tasks going
	// out over 3 s make a throughput.
	k := shard.Keys{Prefix: h.prefix, Queue: "fresh"}
	h.rdb.Set(ctx, k.Pending(3), "not a sorted set", 0)
	prod := h.producer("fresh")
	n := 0
	for i := 0; n < 300; i++ {
		m := []byte(fmt.Sprint("f-", i))
		if shard.Index(m, 4) == 3 {
			continue
		}
		if err := prod.Schedule(ctx, m, time.Now().Add(500*time.Millisecond+time.Duration(n)*10*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	h.collect("fresh", n, 20*time.Second)
	time.Sleep(2 * time.Second)

	_, eval := openPage(t, addr, "#q-fresh")
	header := eval(`document.querySelector('.sub').innerText`)
	section := eval(`document.querySelector('#q-fresh').innerText`)
	axis := func(label string) string {
		return eval(`Array.from(document.querySelectorAll('svg[aria-label="` + label + `"] text.axis')).map(e => e.textContent).join('|')`)
	}
	age, backlog, lateness := axis("oldest due age of fresh over time"), axis("backlog per shard of fresh"), axis("dispatch lateness of fresh")
	published := axis("published per second by fresh")
	t.Logf("header %q\nsection:\n%s\naxes: age %q, backlog %q, lateness %q, published %q", header, section, age, backlog, lateness, published)

	if strings.Contains(header, "refreshes every") {
		t.Errorf("the header promises figures fresher than they are: %q", header)
	}
	if !regexp.MustCompile(`figures read [0-9.]+ ?m?s ago`).MatchString(section) {
		t.Errorf("the queue does not say when its figures were read:\n%s", section)
	}
	for name, a := range map[string]string{"age": age, "backlog": backlog, "lateness": lateness, "published": published} {
		if strings.Count(a, "|") < 1 {
			t.Errorf("%s picture: axis values %q, want at least two", name, a)
		}
	}
	if !strings.Contains(age, "now") || !strings.Contains(backlog, "shard 0") || !strings.Contains(backlog, "shard 3") {
		t.Errorf("axes: age %q (want now), backlog %q (want shard 0 and shard 3)", age, backlog)
	}
	m := regexp.MustCompile(`published ([0-9.]+)/s`).FindStringSubmatch(section)
	if m == nil {
		t.Errorf("the queue does not show what was published per second:\n%s", section)
	}
	if !regexp.MustCompile(`errors: [1-9][0-9]* in the last`).MatchString(section) || !strings.Contains(section, "wrongtype") {
		t.Errorf("the queue does not show its errors (the broken shard's wrongtype):\n%s", section)
	}
}

// openPage loads the status page at addr in a headless browser, waits for
// the element sel, and returns the browser's context and a function that
// evaluates JavaScript on the page.
func openPage(t *testing.T, addr, sel string) (context.Context, func(js string) string) {
	t.Helper()
	step, cancel := context.WithTimeout(browser(t), 60*time.Second)
	t.Cleanup(cancel)
	if err := chromedp.Do(step, chromedp.Navigate("http://"+addr+"/"), chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
		t.Fatal(err)
	}
	return step, func(js string) string {
		t.Helper()
		v, err := chromedp.Run(step, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
}
