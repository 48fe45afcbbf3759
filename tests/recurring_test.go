package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/recurring"
	"github.com/dispatcher/dispatcher/shard"
)

// occurrence is one delivery of a recurring task.
type occurrence struct {
	body string
	due  int64 // x-due-ms
	id   string
	at   time.Time // received
}

// drain reads deliveries of queue until quiet passes with none, or
// timeout.
func (h *harness) drain(queue string, quiet, timeout time.Duration) []occurrence {
	h.t.Helper()
	var out []occurrence
	deadline := time.After(timeout)
	for {
		select {
		case d := <-h.got[queue]:
			due, ok := headerInt(d.Headers["x-due-ms"])
			if !ok {
				h.t.Fatalf("delivery without x-due-ms: %v", d.Headers)
			}
			out = append(out, occurrence{body: string(d.Body), due: due, id: d.MessageId, at: time.Now()})
		case <-time.After(quiet):
			return out
		case <-deadline:
			return out
		}
	}
}

// byBody groups occurrences by body, each group sorted by due time.
func byBody(os []occurrence) map[string][]occurrence {
	out := map[string][]occurrence{}
	for _, o := range os {
		out[o.body] = append(out[o.body], o)
	}
	for _, v := range out {
		sort.Slice(v, func(i, j int) bool { return v[i].due < v[j].due })
	}
	return out
}

// sweeperProc returns the process that holds the queue's sweeper role.
func (h *harness) sweeperProc(queue string, procs []*proc) *proc {
	h.t.Helper()
	var found *proc
	eventually(h.t, 10*time.Second, "a sweeper", func() bool {
		v, _ := h.rdb.Get(context.Background(), shard.Keys{Prefix: h.prefix, Queue: queue}.Sweeper()).Result()
		for _, p := range procs {
			if p.running() && strings.Contains(v, fmt.Sprintf(":%d:", p.cmd.Process.Pid)) {
				found = p
				return true
			}
		}
		return false
	})
	return found
}

// TestRecurringEverySecondThreeInstances runs `@every 1s` for 20 s on three
// instances, SIGKILLs the sweeper after 5 s and SIGSTOPs the next sweeper
// for 6 s at 10 s: every occurrence from the first to the last is
// delivered, none before its due time, and an occurrence arrives twice only
// where a lease expired (claimed by the killed or the stopped instance).
func TestRecurringEverySecondThreeInstances(t *testing.T) {
	t.Parallel() // mostly waiting for occurrences: two such tests share the wait
	q := queueSpec{Name: "jobs", Shards: 4}
	h := newHarness(t, q)
	h.extra["DISPATCHER_LEASE"] = "2s"
	var procs []*proc
	for range 3 {
		procs = append(procs, h.start())
	}
	env := h.env()
	body := `{"job":"tick"}`
	if out, errOut, code := runCLI(t, env, "recurring", "add", "--queue", "jobs", "--name", "tick", "--cron", "@every 1s", body); code != 0 {
		t.Fatalf("recurring add: %d %s %s", code, out, errOut)
	}
	began := time.Now()
	var faults []time.Time // when an instance holding tasks went away
	time.Sleep(5 * time.Second)
	killed := h.sweeperProc("jobs", procs)
	killed.signal(syscall.SIGKILL)
	faults = append(faults, time.Now())
	time.Sleep(5 * time.Second)
	stopped := h.sweeperProc("jobs", procs)
	stopped.signal(syscall.SIGSTOP)
	faults = append(faults, time.Now())
	time.Sleep(6 * time.Second)
	stopped.signal(syscall.SIGCONT)
	faults = append(faults, time.Now())
	time.Sleep(time.Until(began.Add(20 * time.Second)))
	if out, errOut, code := runCLI(t, env, "recurring", "pause", "--queue", "jobs", "--name", "tick"); code != 0 {
		t.Fatalf("recurring pause: %d %s %s", code, out, errOut)
	}
	paused := time.Now()
	got := h.drain("jobs", 4*time.Second, 30*time.Second)

	occ := byBody(got)[body]
	if len(occ) == 0 {
		t.Fatal("nothing delivered")
	}
	seen := map[int64]int{}
	var early []string
	for _, o := range occ {
		seen[o.due]++
		if o.id != shard.MessageID([]byte(body), o.due) {
			t.Errorf("message_id %s for due %d", o.id, o.due)
		}
		if o.at.UnixMilli() < o.due {
			early = append(early, fmt.Sprintf("due %d received %d", o.due, o.at.UnixMilli()))
		}
	}
	first, last := occ[0].due, occ[len(occ)-1].due
	var gaps []string
	for d := first; d <= last; d += 1000 {
		if seen[d] == 0 {
			gaps = append(gaps, time.UnixMilli(d).UTC().Format("15:04:05.000"))
		}
	}
	var dups []string
	for d, n := range seen {
		if n < 2 {
			continue
		}
		near := false
		for _, f := range faults {
			if d >= f.Add(-3*time.Second).UnixMilli() && d <= f.Add(3*time.Second).UnixMilli() {
				near = true
			}
		}
		if !near {
			dups = append(dups, fmt.Sprintf("%s x%d", time.UnixMilli(d).UTC().Format("15:04:05.000"), n))
		}
	}
	t.Logf("%d deliveries of %d occurrences from %s to %s (added %s, paused %s), duplicates %d",
		len(occ), len(seen), time.UnixMilli(first).UTC().Format("15:04:05"), time.UnixMilli(last).UTC().Format("15:04:05"),
		began.UTC().Format("15:04:05.000"), paused.UTC().Format("15:04:05.000"), len(occ)-len(seen))
	if first > began.Add(2*time.Second).UnixMilli() {
		t.Errorf("first occurrence %s, more than 2 s after the schedule was added", time.UnixMilli(first).UTC())
	}
	if last < paused.Add(-2*time.Second).UnixMilli() {
		t.Errorf("last occurrence %s, more than 2 s before the schedule was paused at %s", time.UnixMilli(last).UTC(), paused.UTC())
	}
	if len(gaps) > 0 {
		t.Errorf("occurrences never delivered: %v", gaps)
	}
	if len(early) > 0 {
		t.Errorf("delivered before due: %v", early)
	}
	if len(dups) > 0 {
		t.Errorf("delivered twice away from a kill or stop: %v", dups)
	}
}

// TestRecurringDSTEndToEnd: a daily 02:30 Europe/Berlin schedule whose
// last occurrence ran two days before the latest spring-forward (29 March
// in 2026), with the "all" catch-up policy, delivers every day's
// occurrence since through real servers, and their x-due-ms and message_id
// are those computed: on the spring day (02:30 does not exist) at 03:00
// CEST, on the autumn day (02:30 twice) once, at 02:30 CEST.
func TestRecurringDSTEndToEnd(t *testing.T) {
	t.Parallel() // mostly waiting for occurrences: two such tests share the wait
	q := queueSpec{Name: "daily", Shards: 8}
	h := newHarness(t, q)
	ctx := context.Background()
	keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	st := recurring.NewStore(h.rdb, keys)
	def := recurring.Def{Queue: q.Name, Name: "berlin", Cron: "30 2 * * *", TZ: "Europe/Berlin", Body: "report", CatchUp: recurring.CatchUpAll, Source: "cli"}
	s, err := recurring.Parse(def)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, def); err != nil {
		t.Fatal(err)
	}
	defs, _, _ := st.Defs(ctx)
	// As if the last occurrence had run on 27 March: the state a
	// materialiser leaves (docs/recurring.md).
	// The most recent spring-forward at least two days ago (Europe/Berlin:
	// the last Sunday of March, 01:00 UTC), so that the catch-up crosses it
	// and, from November on, the autumn change too, whenever the test runs.
	lastSunday := func(y int, m time.Month) time.Time {
		d := time.Date(y, m+1, 0, 1, 0, 0, 0, time.UTC) // the month's last day, 01:00 UTC
		return d.AddDate(0, 0, -int(d.Weekday()))
	}
	y := time.Now().Year()
	if time.Now().Before(lastSunday(y, time.March).AddDate(0, 0, 2)) {
		y--
	}
	spring, autumn := lastSunday(y, time.March), lastSunday(y, time.October)
	cursor := spring.AddDate(0, 0, -2).Add(30 * time.Minute) // 02:30 CET two days before
	i := shard.Index([]byte(def.Body), q.Shards)
	h.rdb.HSet(ctx, keys.RecurringState(i), def.Name, fmt.Sprintf("%d:%d:", defs[0].Rev, cursor.UnixMilli()))
	// The occurrences computed, up to a day ahead of now (the last one is
	// due in the future and stays pending).
	var want []int64
	now := time.Now()
	for t := s.NextAfter(cursor); t.Before(now); t = s.NextAfter(t) {
		want = append(want, t.UnixMilli())
	}
	h.start()
	got := h.drain(q.Name, 3*time.Second, 60*time.Second)
	occ := byBody(got)[def.Body]
	var dues []int64
	for _, o := range occ {
		dues = append(dues, o.due)
		if o.id != shard.MessageID([]byte(def.Body), o.due) {
			t.Errorf("message_id %s for due %d", o.id, o.due)
		}
	}
	if fmt.Sprint(dues) != fmt.Sprint(want) {
		t.Fatalf("delivered %d occurrences, want %d:\n got %v\nwant %v", len(dues), len(want), dues, want)
	}
	for _, c := range []time.Time{
		spring.AddDate(0, 0, -1).Add(30 * time.Minute), // 02:30 CET the day before
		spring, // 02:30 does not exist: at the jump, 03:00 CEST = 01:00 UTC
		spring.AddDate(0, 0, 1).Add(-30 * time.Minute), // 02:30 CEST the day after
		autumn.Add(-30 * time.Minute),                  // 02:30 happens twice: once, the first (CEST)
		autumn.AddDate(0, 0, 1).Add(30 * time.Minute),  // 02:30 CET the day after
	} {
		if time.Now().After(c) {
			found := false
			for _, d := range dues {
				found = found || d == c.UnixMilli()
			}
			if !found {
				t.Errorf("no occurrence at %s", c)
			}
		}
	}
	for _, d := range dues {
		if d == autumn.Add(30*time.Minute).UnixMilli() {
			t.Errorf("02:30 ran twice on %s", autumn.Format("2006-01-02"))
		}
	}
	t.Logf("%d daily occurrences delivered, %s to %s", len(dues), time.UnixMilli(dues[0]).UTC(), time.UnixMilli(dues[len(dues)-1]).UTC())
	// The next one is pending, due at the next 02:30 Berlin.
	next := s.NextAfter(now)
	eventually(t, 5*time.Second, "the next occurrence pending", func() bool {
		sc, err := h.rdb.ZScore(ctx, keys.Pending(i), def.Body).Result()
		return err == nil && int64(sc) == next.UnixMilli()
	})
}

// TestRecurringOutagePolicies stops the only instance across at least
// five occurrences of three `@every 2s` schedules (grace 1s), one per
// catch-up policy, then starts it again: "all" fires every missed one,
// "latest" only the most recent, "skip" none. (Under every policy the
// occurrence that was already pending at the stop is delivered late.)
func TestRecurringOutagePolicies(t *testing.T) {
	t.Parallel() // mostly waiting for occurrences: two such tests share the wait
	q := queueSpec{Name: "outage", Shards: 4}
	h := newHarness(t, q)
	env := h.env()
	for _, p := range []string{"all", "latest", "skip"} {
		if out, errOut, code := runCLI(t, env, "recurring", "add", "--queue", q.Name, "--name", p, "--cron", "@every 2s",
			"--grace", "1s", "--catchup", p, "body-"+p); code != 0 {
			t.Fatalf("recurring add: %d %s %s", code, out, errOut)
		}
	}
	p := h.start()
	time.Sleep(5 * time.Second)
	p.signal(syscall.SIGTERM)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	down := time.Now()
	keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	for _, p := range []string{"all", "latest", "skip"} {
		i := shard.Index([]byte("body-"+p), q.Shards)
		sc, err := h.rdb.ZScore(context.Background(), keys.Pending(i), "body-"+p).Result()
		t.Logf("at the stop (%s): %s state %q, pending at %v (%v)", down.UTC().Format("05.000"), p,
			h.rdb.HGet(context.Background(), keys.RecurringState(i), p).Val(), int64(sc), err)
	}
	time.Sleep(13 * time.Second) // the pending one and five more, and a bit
	p2 := h.start()
	// When the restarted instance began to materialise: occurrences due
	// since the stop and by then were missed.
	var resumed time.Time
	eventually(t, 10*time.Second, "the restarted instance materialising", func() bool {
		for _, l := range strings.Split(p2.out.String(), "\n") {
			if strings.Contains(l, "materialising the queue's recurring schedules") {
				ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
				resumed, _ = time.Parse(time.RFC3339Nano, ts)
				return true
			}
		}
		return false
	})
	time.Sleep(5 * time.Second)
	got := byBody(h.drain(q.Name, 3*time.Second, 30*time.Second))
	for _, p := range []string{"all", "latest", "skip"} {
		occ := got["body-"+p]
		var missedFired, before, after int
		var dues []string
		for _, o := range occ {
			dues = append(dues, time.UnixMilli(o.due).UTC().Format("05.000"))
			switch {
			// The occurrence after the last one delivered was already
			// pending when the instance stopped: an ordinary task, delivered
			// late when it is back, whatever the policy.
			case o.due <= down.UnixMilli()+2000:
				before++
			case o.due <= resumed.UnixMilli():
				missedFired++
			default:
				after++
			}
		}
		missed := 0 // occurrences in the schedule's phase due after the stop, by the restart
		if len(occ) > 0 {
			for d := occ[0].due; d <= resumed.UnixMilli(); d += 2000 {
				if d > down.UnixMilli()+2000 {
					missed++
				}
			}
		}
		t.Logf("%s: %d before the stop, %d of about %d missed fired, %d after: %v", p, before, missedFired, missed, after, dues)
		if before < 2 || after < 2 {
			t.Errorf("%s: %d before the stop and %d after the restart, want at least 2 each", p, before, after)
		}
		if missed < 5 {
			t.Errorf("only about %d occurrences missed", missed)
		}
		switch p {
		case "all":
			if missedFired < missed {
				t.Errorf("all: %d missed occurrences fired, want every one (%d)", missedFired, missed)
			}
			for i := 1; i < len(occ); i++ {
				if occ[i].due-occ[i-1].due != 2000 {
					t.Errorf("all: gap from %d to %d", occ[i-1].due, occ[i].due)
				}
			}
		case "latest":
			// Exactly the most recent missed one fired: the most recent due
			// by the decision, whose log line names the one it fires and
			// whose time is when it was made (a few ms after the
			// materialising line; an occurrence due in those ms is missed
			// too, one due just after them is not).
			decided, firing := latestDecision(t, p2.out.String())
			last := occ[0].due
			for d := occ[0].due; d <= decided.UnixMilli(); d += 2000 {
				last = d
			}
			if firing.UnixMilli() != last {
				t.Errorf("latest: decided at %s to fire %d, not the most recent missed one, %d", decided.Format("05.000"), firing.UnixMilli(), last)
			}
			var fired []int64 // missed ones fired: due after the stop, by the decision
			for _, o := range occ {
				if o.due > down.UnixMilli()+2000 && o.due <= decided.UnixMilli() {
					fired = append(fired, o.due)
				}
			}
			if len(fired) != 1 || fired[0] != last {
				t.Errorf("latest: missed occurrences fired %v, want only %d", fired, last)
			}
			// and every one after it.
			for i, o := range occ {
				if i > 0 && o.due > last && o.due-occ[i-1].due != 2000 {
					t.Errorf("latest: gap from %d to %d after the restart", occ[i-1].due, o.due)
				}
			}
		case "skip":
			if missedFired != 0 {
				t.Errorf("skip: %d missed occurrences fired, want none", missedFired)
			}
		}
	}
}

// latestDecision reads, from an instance's output, when it decided what
// the "latest" schedule's missed occurrences fire, and the one it fires.
func latestDecision(t *testing.T, out string) (decided, firing time.Time) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "missed occurrences") || !strings.Contains(l, "schedule=latest ") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
		_, f, _ := strings.Cut(l, "firing=")
		f, _, _ = strings.Cut(f, " ")
		var err1, err2 error
		decided, err1 = time.Parse(time.RFC3339Nano, ts)
		firing, err2 = time.Parse(time.RFC3339Nano, f)
		if err1 != nil || err2 != nil {
			t.Fatalf("the latest schedule's decision %q: %v %v", l, err1, err2)
		}
		return decided, firing
	}
	t.Fatalf("no decision of the latest schedule in the output:\n%s", out)
	return
}

// writeFile writes a schedule file atomically (as an editor or a
// ConfigMap does).
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestRecurringFileEdited edits the schedule file under a running
// instance: an added schedule starts, a changed one follows its new body,
// a removed one stops, and a schedule added from the CLI is left alone.
func TestRecurringFileEdited(t *testing.T) {
	t.Parallel() // mostly waiting for occurrences: two such tests share the wait
	q := queueSpec{Name: "files", Shards: 4}
	h := newHarness(t, q)
	path := filepath.Join(t.TempDir(), "recurring.json")
	writeFile(t, path, `{"schedules": [
  {"queue": "files", "name": "a", "cron": "@every 1s", "body": "A"},
  {"queue": "files", "name": "b", "cron": "@every 1s", "body": "B"}
]}`)
	h.extra["DISPATCHER_RECURRING_FILE"] = path
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	env := h.env()
	if out, errOut, code := runCLI(t, env, "recurring", "add", "--queue", "files", "--name", "cli", "--cron", "@every 1s", "CLI"); code != 0 {
		t.Fatalf("recurring add: %d %s %s", code, out, errOut)
	}
	p := h.start()
	got := byBody(h.drain(q.Name, 10*time.Second, 4*time.Second))
	for _, b := range []string{"A", "B", "CLI"} {
		if len(got[b]) < 2 {
			t.Fatalf("before the edit: %d occurrences of %s, want at least 2", len(got[b]), b)
		}
	}
	writeFile(t, path, `{"schedules": [
  {"queue": "files", "name": "b", "cron": "@every 1s", "body": "B2"},
  {"queue": "files", "name": "c", "cron": "*/1 * * * * *", "body": "C"}
]}`)
	edited := time.Now()
	eventually(t, 10*time.Second, "the edit applied", func() bool { return strings.Contains(p.out.String(), "added=1 changed=1 removed=1") })
	applied := time.Now()
	t.Logf("applied %s after the edit", applied.Sub(edited).Round(time.Millisecond))
	// What was claimed before the edit (up to the look-ahead ahead of its
	// due time) still goes out: let it.
	_ = h.drain(q.Name, 2*time.Second, 2*time.Second)
	got = byBody(h.drain(q.Name, 10*time.Second, 5*time.Second))
	if n := len(got["A"]) + len(got["B"]); n > 0 {
		t.Errorf("removed or changed schedules still fire: A %d, B %d", len(got["A"]), len(got["B"]))
	}
	for _, b := range []string{"B2", "C", "CLI"} {
		if len(got[b]) < 3 {
			t.Errorf("after the edit: %d occurrences of %s, want at least 3", len(got[b]), b)
		}
	}
	out, _, _ := runCLI(t, env, "recurring", "list", "--queue", "files")
	for _, want := range []string{"b ", "c ", "cli "} {
		if !strings.Contains(out, want) {
			t.Errorf("recurring list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\"A\"") {
		t.Errorf("recurring list still has a:\n%s", out)
	}
	// Metrics and the status page, on the sweeping (only) instance.
	series := func(name, sched string) string {
		return fmt.Sprintf(`%s{queue="files",schedule=%q}`, name, sched)
	}
	for _, sched := range []string{"b", "c", "cli"} {
		next, ok := tryMetric(addr, series("dispatcher_recurring_next_due_timestamp_seconds", sched))
		if !ok || next < float64(time.Now().Add(-5*time.Second).Unix()) {
			t.Errorf("%s: next due metric %v %v", sched, next, ok)
		}
		if v, ok := tryMetric(addr, series("dispatcher_recurring_failing", sched)); !ok || v != 0 {
			t.Errorf("%s: failing metric %v %v", sched, v, ok)
		}
		if v, ok := tryMetric(addr, series("dispatcher_recurring_paused", sched)); !ok || v != 0 {
			t.Errorf("%s: paused metric %v %v", sched, v, ok)
		}
	}
	if _, ok := tryMetric(addr, series("dispatcher_recurring_paused", "a")); ok {
		t.Error("the removed schedule still has metrics")
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), "Recurring schedules") || !strings.Contains(string(page), "<td>cli</td>") {
		t.Errorf("the status page lacks the schedules")
	}
	t.Logf("recurring list:\n%s", out)
}

// TestRecurringBadInput: a schedule file with an invalid cron expression,
// an unknown zone and a queue the instance does not serve, beside a good
// schedule: one error line naming each bad one, the good one fires, and
// ordinary tasks are dispatched as ever. The CLI refuses the same input
// with one line and exit code 2.
func TestRecurringBadInput(t *testing.T) {
	t.Parallel() // mostly waiting for occurrences: two such tests share the wait
	q := queueSpec{Name: "mixed", Shards: 4}
	h := newHarness(t, q)
	path := filepath.Join(t.TempDir(), "recurring.json")
	writeFile(t, path, `{"schedules": [
  {"queue": "mixed", "name": "good", "cron": "@every 1s", "body": "good"},
  {"queue": "mixed", "name": "badcron", "cron": "0 25 * * *", "body": "x"},
  {"queue": "mixed", "name": "badzone", "cron": "0 9 * * *", "tz": "Europe/Atlantis", "body": "y"},
  {"queue": "elsewhere", "name": "notserved", "cron": "0 9 * * *", "body": "z"}
]}`)
	h.extra["DISPATCHER_RECURRING_FILE"] = path
	env := h.env()
	for _, args := range [][]string{
		{"--name", "badcron", "--cron", "0 25 * * *", "x"},
		{"--name", "badzone", "--cron", "0 9 * * *", "--tz", "Europe/Atlantis", "y"},
	} {
		out, errOut, code := runCLI(t, env, append([]string{"recurring", "add", "--queue", "mixed"}, args...)...)
		if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "mixed/"+args[1]) {
			t.Errorf("recurring add %v: exit %d, stdout %q, stderr %q; want exit 2 and one line naming it", args, code, out, errOut)
		}
	}
	_, errOut, code := runCLI(t, env, "recurring", "add", "--queue", "elsewhere", "--name", "n", "--cron", "@daily", "z")
	if code != 2 || !strings.Contains(errOut, `"elsewhere"`) {
		t.Errorf("recurring add to a queue not served: exit %d, %q", code, errOut)
	}
	// Before any instance runs, the list says nothing is materialised.
	if _, _, code := runCLI(t, env, "recurring", "add", "--queue", "mixed", "--name", "viacli", "--cron", "@every 1s", "viacli"); code != 0 {
		t.Fatal("recurring add failed")
	}
	if out, _, _ := runCLI(t, env, "recurring", "list"); !strings.Contains(out, "FAILING: no instance serves queue mixed") {
		t.Errorf("recurring list with no instance running:\n%s", out)
	}
	p := h.start()
	prod := h.producer(q.Name)
	due := time.Now().Add(2 * time.Second)
	if err := prod.Schedule(context.Background(), []byte("one-off"), due); err != nil {
		t.Fatal(err)
	}
	got := byBody(h.drain(q.Name, 10*time.Second, 5*time.Second))
	if len(got["good"]) < 3 || len(got["viacli"]) < 3 {
		t.Errorf("the good schedules fired %d and %d times, want at least 3", len(got["good"]), len(got["viacli"]))
	}
	if out, _, _ := runCLI(t, env, "recurring", "list"); strings.Contains(out, "FAILING") {
		t.Errorf("recurring list with an instance running:\n%s", out)
	}
	if len(got["one-off"]) != 1 || got["one-off"][0].due != due.UnixMilli() {
		t.Errorf("the ordinary task: %v", got["one-off"])
	}
	for _, b := range []string{"x", "y", "z"} {
		if len(got[b]) > 0 {
			t.Errorf("bad schedule's body %s delivered", b)
		}
	}
	logs := p.out.String()
	for _, name := range []string{"mixed/badcron", "mixed/badzone", "elsewhere/notserved"} {
		var lines []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, name) {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") {
			t.Errorf("%s: want one error line, got %d:\n%s", name, len(lines), strings.Join(lines, "\n"))
		} else {
			t.Logf("%s", lines[0])
		}
	}
}

// TestRecurringAcrossReshard runs eight `@every 1s` schedules on two
// instances while the queue grows from 4 to 16 shards and shrinks back to
// 4, each change finished: the schedules' states follow their bodies'
// shards, and every occurrence is delivered once.
func TestRecurringAcrossReshard(t *testing.T) {
	t.Parallel() // mostly waiting for occurrences: two such tests share the wait
	q := queueSpec{Name: "grow", Shards: 4}
	h := newHarness(t, q)
	p1, p2 := h.start(), h.start()
	env := h.env()
	var bodies []string
	moved := 0
	for k := range 8 {
		b := fmt.Sprintf("every-second-%d", k)
		bodies = append(bodies, b)
		if shard.Index([]byte(b), 4) != shard.Index([]byte(b), 16) {
			moved++
		}
		if out, errOut, code := runCLI(t, env, "recurring", "add", "--queue", q.Name, "--name", fmt.Sprintf("s%d", k), "--cron", "@every 1s", b); code != 0 {
			t.Fatalf("recurring add: %d %s %s", code, out, errOut)
		}
	}
	if moved == 0 {
		t.Fatal("no body changes shard: pick others")
	}
	began := time.Now()
	for _, step := range [][]string{
		{"reshard", "--queue", q.Name, "--shards", "16"},
		{"reshard", "finish", "--queue", q.Name},
		{"reshard", "--queue", q.Name, "--shards", "4"},
		{"reshard", "finish", "--queue", q.Name},
	} {
		time.Sleep(3 * time.Second)
		if out, errOut, code := runCLI(t, env, step...); code != 0 {
			t.Fatalf("%v: %d %s %s", step, code, out, errOut)
		}
	}
	time.Sleep(3 * time.Second)
	for k := range bodies {
		if _, _, code := runCLI(t, env, "recurring", "pause", "--queue", q.Name, "--name", fmt.Sprintf("s%d", k)); code != 0 {
			t.Fatal("pause failed")
		}
	}
	got := byBody(h.drain(q.Name, 3*time.Second, 60*time.Second))
	for _, b := range bodies {
		occ := got[b]
		if len(occ) < 10 {
			t.Errorf("%s: %d occurrences in %s", b, len(occ), time.Since(began).Round(time.Second))
			continue
		}
		seen := map[int64]int{}
		for _, o := range occ {
			seen[o.due]++
		}
		var gaps, dups []string
		for d := occ[0].due; d <= occ[len(occ)-1].due; d += 1000 {
			switch seen[d] {
			case 0:
				gaps = append(gaps, time.UnixMilli(d).UTC().Format("05.000"))
			case 1:
			default:
				dups = append(dups, time.UnixMilli(d).UTC().Format("05.000"))
			}
		}
		if len(gaps) > 0 || len(dups) > 0 {
			t.Errorf("%s (shard %d of 4, %d of 16): missing %v, twice %v", b, shard.Index([]byte(b), 4), shard.Index([]byte(b), 16), gaps, dups)
		}
	}
	logs := p1.out.String() + p2.out.String()
	if n := strings.Count(logs, "recurring schedule's state moved"); n < 2*moved {
		t.Errorf("states moved %d times, want %d (there and back)", n, 2*moved)
	}
	t.Logf("%d schedules, %d of them change shard; %d occurrences each on average", len(bodies), moved, func() int {
		n := 0
		for _, b := range bodies {
			n += len(got[b])
		}
		return n / len(bodies)
	}())
}

// totalCommands reads a private Redis's command count, less the INFO
// calls that read it.
func totalCommands(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, _ := strconv.ParseInt(rest, 10, 64)
			return n
		}
	}
	t.Fatal("no total_commands_processed")
	return 0
}

// TestRecurringIdleCost measures what 1,000 schedules with nothing due
// cost Redis: the commands per second of one instance serving one queue
// of 16 shards holding the same 1,000 pending tasks (daily occurrences,
// none due within the hour), first scheduled as one-off tasks, then
// materialised by 1,000 schedules; a private Redis, so that only this
// dispatcher counts. The difference is the schedules' own cost. The
// figure is in docs/recurring.md.
func TestRecurringIdleCost(t *testing.T) {
	if os.Getenv("DISPATCHER_TEST_MEASURE") == "" {
		t.Skip("a measurement (35 s), not a check: DISPATCHER_TEST_MEASURE=1 go test ./tests -run TestRecurringIdleCost")
	}
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	q := queueSpec{Name: "idle", Shards: 16}
	h := newHarnessOn(t, srv.Client(), q)
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	rdb := srv.Client()
	ctx := context.Background()
	keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	h.start()
	measure := func() float64 {
		rdb.ConfigResetStat(context.Background())
		before, began := totalCommands(t, rdb), time.Now()
		time.Sleep(12 * time.Second)
		rate := float64(totalCommands(t, rdb)-before-1) / time.Since(began).Seconds()
		info, _ := rdb.Info(context.Background(), "commandstats").Result()
		var per []string
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"); ok {
				name, stats, _ := strings.Cut(rest, ":")
				calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
				per = append(per, name+"="+calls)
			}
		}
		t.Logf("%.1f commands/s; calls in %s: %s", rate, time.Since(began).Round(time.Second), strings.Join(per, " "))
		return rate
	}
	hour := (time.Now().UTC().Hour() + 2) % 24
	var defs []recurring.Def
	var tasks []shard.Task
	for k := range 1000 {
		d := recurring.Def{Queue: q.Name, Name: fmt.Sprintf("s%04d", k), Cron: fmt.Sprintf("%d %d * * *", k%60, hour),
			Body: fmt.Sprintf(`{"report":%d}`, k), Source: "cli"}
		s, err := recurring.Parse(d)
		if err != nil {
			t.Fatal(err)
		}
		defs = append(defs, d)
		tasks = append(tasks, shard.Task{Member: []byte(d.Body), Due: s.NextAfter(time.Now())})
	}
	pending := func() int64 {
		n := int64(0)
		for i := range q.Shards {
			n += rdb.ZCard(ctx, keys.Pending(i)).Val()
		}
		return n
	}
	p := h.producer(q.Name)
	if err := p.ScheduleMany(ctx, tasks); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // sweeps stretched out
	without := measure()

	for _, task := range tasks {
		if _, err := p.Cancel(ctx, task.Member); err != nil {
			t.Fatal(err)
		}
	}
	st := recurring.NewStore(rdb, keys)
	for _, d := range defs {
		if _, err := st.Put(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	added := time.Now()
	eventually(t, 60*time.Second, "1,000 occurrences pending", func() bool { return pending() == 1000 })
	t.Logf("1,000 schedules materialised in %s", time.Since(added).Round(time.Millisecond))
	time.Sleep(4 * time.Second)
	with := measure()
	t.Logf("Redis commands/s, one instance, one queue of 16 shards with 1,000 tasks pending for later: %.1f as one-off tasks, %.1f as 1,000 idle schedules' occurrences (+%.1f)", without, with, with-without)
	if with-without > 5 {
		t.Errorf("1,000 idle schedules cost %.1f commands/s, want at most 5", with-without)
	}
}
