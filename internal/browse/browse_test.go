package browse

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/glob"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

const shards = 4

// fill schedules n tasks over 4 shards as producers do: a third share one
// due time (ties spanning many pages and every shard), the rest spread
// over 1000 due times (more ties). It returns them in the walk's order.
func fill(t *testing.T, rdb redis.UniversalClient, k shard.Keys, n int) []Task {
	t.Helper()
	ctx := context.Background()
	const t0 = int64(1_800_000_000_000)
	rng := rand.New(rand.NewPCG(1, 2))
	pipe := rdb.Pipeline()
	var want []Task
	for j := range n {
		body := fmt.Sprintf("task-%05d-%x", j, rng.Uint32())
		due := t0
		if j%3 != 0 {
			due = t0 + rng.Int64N(1000)*1000
		}
		i := shard.Index([]byte(body), shards)
		pipe.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(due), Member: body})
		want = append(want, Task{Shard: i, DueMs: due, Body: body, Member: body, Entry: body, MessageID: shard.MessageID([]byte(body), due),
			Score: strconv.FormatInt(due, 10)})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want, order)
	return want
}

// order is the walk's order: (due, shard, body).
func order(a, b Task) int {
	return cmp.Or(cmp.Compare(a.DueMs, b.DueMs), cmp.Compare(a.Shard, b.Shard), cmp.Compare(a.Body, b.Body))
}

func setup(t *testing.T) (*redis.Client, shard.Keys) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	return rdb, shard.Keys{Prefix: prefix, Queue: "q"}
}

// walkAll pages through q with limit, the cursor printed and read back as
// a user would, calling between after each page; it fails on a page over
// the limit or the budget.
func walkAll(t *testing.T, rdb redis.UniversalClient, q Query, between func(Page)) (tasks []Task, pages int) {
	t.Helper()
	for {
		p, err := Walk(context.Background(), rdb, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tasks) > max(q.Limit, DefaultLimit*btoi(q.Limit == 0)) || (q.Budget > 0 && p.Scanned > max(q.Budget, q.Limit)) {
			t.Fatalf("page of %d tasks, %d scanned: over limit %d or budget %d", len(p.Tasks), p.Scanned, q.Limit, q.Budget)
		}
		tasks = append(tasks, p.Tasks...)
		pages++
		if between != nil {
			between(p)
		}
		if p.Next == nil {
			return tasks, pages
		}
		c, err := ParseCursor(p.Next.String())
		if err != nil || c != *p.Next {
			t.Fatalf("cursor %s read back as %+v, %v", p.Next, c, err)
		}
		q.After = &c
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestListPendingInOrderAcrossPages walks 10^4 pending tasks, 3334 of
// them due at one instant, in pages of 97: every task once, in order,
// no gaps, although the ties span dozens of pages.
func TestListPendingInOrderAcrossPages(t *testing.T) {
	rdb, k := setup(t)
	want := fill(t, rdb, k, 10_000)
	q := Query{Keys: k, State: Pending, Shards: []int{0, 1, 2, 3}, Limit: 97}
	got, pages := walkAll(t, rdb, q, nil)
	if pages != 104 {
		t.Errorf("%d pages of 97 for 10^4 tasks, want 104", pages)
	}
	if !slices.EqualFunc(got, want, sameTask) {
		t.Fatalf("walk differs from the sorted tasks: got %d, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
}

// sameTask compares tasks field by field (Properties is a slice).
func sameTask(a, b Task) bool { return reflect.DeepEqual(a, b) }

func firstDiff(a, b []Task) int {
	for n := range min(len(a), len(b)) {
		if !sameTask(a[n], b[n]) {
			return n
		}
	}
	return min(len(a), len(b))
}

// TestListCursorAfterItsTaskLeft continues from cursors whose task was
// dispatched in between (the binary search among equal due times), and
// from tasks scheduled behind the cursor meanwhile (not shown: the walk
// goes forward): every task still pending once, none skipped.
func TestListCursorAfterItsTaskLeft(t *testing.T) {
	rdb, k := setup(t)
	ctx := context.Background()
	want := fill(t, rdb, k, 3000)
	q := Query{Keys: k, State: Pending, Shards: []int{0, 1, 2, 3}, Limit: 50}
	got, _ := walkAll(t, rdb, q, func(p Page) {
		if p.Next == nil {
			return
		}
		// The cursor's own task leaves, and so does the next of its shard.
		c := p.Next
		rdb.ZRem(ctx, k.Pending(c.Shard), c.Member)
		if zs := rdb.ZRangeByScore(ctx, k.Pending(c.Shard), &redis.ZRangeBy{Min: FormatScore(c.Score), Max: "+inf"}).Val(); len(zs) > 0 {
			for _, m := range zs {
				if m > c.Member {
					rdb.ZRem(ctx, k.Pending(c.Shard), m)
					break
				}
			}
		}
		rdb.ZAdd(ctx, k.Pending(c.Shard), redis.Z{Score: c.Score - 1, Member: "late-" + c.Member})
	})
	left := map[string]bool{}
	for _, w := range want {
		if rdb.ZScore(ctx, k.Pending(w.Shard), w.Body).Err() == nil {
			left[w.Body] = true
		}
	}
	seen := map[string]bool{}
	for n, g := range got {
		if n > 0 && order(got[n-1], g) >= 0 {
			t.Fatalf("out of order at %d: %+v then %+v", n, got[n-1], g)
		}
		seen[g.Body] = true
	}
	for b := range left {
		if !seen[b] {
			t.Errorf("%s, pending throughout, was skipped", b)
		}
	}
	if len(got) < len(left) || len(got) > len(left)+len(want)-len(left) {
		t.Errorf("walked %d tasks, %d pending at the end", len(got), len(left))
	}
}

// TestListFilters: from/to on the due time and a glob on the body give
// what filtering the whole set would, and a selective glob ends each walk
// within its budget, with a cursor.
func TestListFilters(t *testing.T) {
	rdb, k := setup(t)
	all := fill(t, rdb, k, 3000)
	from, to := all[1500].DueMs, all[2500].DueMs
	var want []Task
	for _, w := range all {
		if w.DueMs >= from && w.DueMs <= to && glob.Match("task-0??7?-*", w.Body) {
			want = append(want, w)
		}
	}
	q := Query{Keys: k, State: Pending, Shards: []int{0, 1, 2, 3}, From: &from, To: &to, Match: "task-0??7?-*", Limit: 7, Budget: 200}
	got, pages := walkAll(t, rdb, q, nil)
	if !slices.EqualFunc(got, want, sameTask) || len(want) == 0 {
		t.Fatalf("from %d to %d matching: got %d tasks, want %d", from, to, len(got), len(want))
	}
	if pages < 5 {
		t.Errorf("%d pages: the budget of 200 did not end walks early", pages)
	}
	// A glob without a reading common to every Redis: refused.
	if _, err := Walk(context.Background(), rdb, Query{Keys: k, State: Pending, Shards: []int{0}, Match: "[a-é]*"}); err == nil ||
		!strings.Contains(err.Error(), `glob "[a-é]*"`) {
		t.Errorf("Walk with [a-é]*: %v, want the glob refused", err)
	}
	// No match at all: bounded pages with cursors, then the end.
	q = Query{Keys: k, State: Pending, Shards: []int{0, 1, 2, 3}, Match: "nothing*", Budget: 1000}
	got, pages = walkAll(t, rdb, q, nil)
	if len(got) != 0 || pages != 3 {
		t.Errorf("matching nothing: %d tasks in %d pages, want 0 in 3 (budget 1000 of 3000)", len(got), pages)
	}
}

// TestListInflightAndDead: in flight by lease, with due time and failed
// attempts; dead by due time, with the reason; only the shards asked.
func TestListInflightAndDead(t *testing.T) {
	rdb, k := setup(t)
	ctx := context.Background()
	const due = int64(1_800_000_000_000)
	var wantIn, wantDead []Task
	for j := range 600 {
		body := "b" + strconv.Itoa(j)
		i := shard.Index([]byte(body), shards)
		d := due - int64(j)*1000 // later tasks are due earlier
		e := fmt.Sprintf("%d:%s", d, body)
		lease := due + int64(j%10)
		rdb.ZAdd(ctx, k.Inflight(i), redis.Z{Score: float64(lease), Member: e})
		rdb.HSet(ctx, k.Attempts(i), e, j%3)
		wantIn = append(wantIn, Task{Shard: i, DueMs: d, Body: body, Member: body, Entry: e, LeaseMs: lease, Attempts: j % 3, MessageID: shard.MessageID([]byte(body), d)})
		rdb.ZAdd(ctx, k.Dead(i), redis.Z{Score: float64(d), Member: e})
		rdb.HSet(ctx, k.DeadReason(i), e, "refused "+body)
		wantDead = append(wantDead, Task{Shard: i, DueMs: d, Body: body, Member: body, Entry: e, Reason: "refused " + body, MessageID: shard.MessageID([]byte(body), d)})
	}
	slices.SortFunc(wantIn, func(a, b Task) int {
		return cmp.Or(cmp.Compare(a.LeaseMs, b.LeaseMs), cmp.Compare(a.Shard, b.Shard), cmp.Compare(a.Entry, b.Entry))
	})
	slices.SortFunc(wantDead, order)
	got, _ := walkAll(t, rdb, Query{Keys: k, State: Inflight, Shards: []int{0, 1, 2, 3}, Limit: 33}, nil)
	if !slices.EqualFunc(got, wantIn, sameTask) {
		t.Errorf("in flight: got %d, want %d; first difference at %d", len(got), len(wantIn), firstDiff(got, wantIn))
	}
	got, _ = walkAll(t, rdb, Query{Keys: k, State: Dead, Shards: []int{0, 1, 2, 3}, Limit: 33}, nil)
	if !slices.EqualFunc(got, wantDead, sameTask) {
		t.Errorf("dead: got %d, want %d; first difference at %d", len(got), len(wantDead), firstDiff(got, wantDead))
	}
	// from/to in flight is on the due time, not the lease.
	from, to := due-99_000, due-50_000
	got, _ = walkAll(t, rdb, Query{Keys: k, State: Inflight, Shards: []int{2}, From: &from, To: &to}, nil)
	n := 0
	for _, w := range wantIn {
		if w.Shard == 2 && w.DueMs >= from && w.DueMs <= to {
			if n >= len(got) || !sameTask(got[n], w) {
				t.Fatalf("in flight on shard 2 due %d..%d: got %+v", from, to, got)
			}
			n++
		}
	}
	if n != len(got) || n == 0 {
		t.Errorf("in flight on shard 2 due %d..%d: %d tasks, want %d", from, to, len(got), n)
	}
	// A cursor of one state does not continue another.
	p, _ := Walk(ctx, rdb, Query{Keys: k, State: Dead, Shards: []int{0}, Limit: 1})
	if _, err := Walk(ctx, rdb, Query{Keys: k, State: Pending, Shards: []int{0}, After: p.Next}); err == nil {
		t.Error("a dead cursor continued a pending walk")
	}
}

func TestListCursorText(t *testing.T) {
	c := Cursor{State: Dead, Shard: 12, Pos: Pos{Score: 1767225600000, Member: "a:b\x00\xff"}}
	got, err := ParseCursor(c.String())
	if err != nil || got != c {
		t.Errorf("%s read back as %+v, %v", c, got, err)
	}
	for _, bad := range []string{"", "pending", "queued:1:0:", "pending:x:0:", "pending:1:-1:", "pending:1:0:!!"} {
		if _, err := ParseCursor(bad); err == nil {
			t.Errorf("ParseCursor(%q) accepted", bad)
		}
	}
}

// TestListBadScores: pending tasks are shown with the due time and
// message_id the dispatcher gives them: -inf due at 0, a fraction at its
// floor, a negative one as it is; +inf is never due and has no
// message_id; every score as Redis holds it.
func TestListBadScores(t *testing.T) {
	rdb, k := setup(t)
	ctx := context.Background()
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: math.Inf(-1), Member: "minus-inf"}, redis.Z{Score: -5, Member: "minus-five"},
		redis.Z{Score: 1767225600000.75, Member: "fraction"}, redis.Z{Score: 1767225600000000, Member: "micros"},
		redis.Z{Score: math.Inf(1), Member: "plus-inf"})
	p, err := Walk(ctx, rdb, Query{Keys: k, State: Pending, Shards: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Task{
		{Body: "minus-inf", DueMs: 0, Score: "-inf", MessageID: shard.MessageID([]byte("minus-inf"), 0)},
		{Body: "minus-five", DueMs: -5, Score: "-5", MessageID: shard.MessageID([]byte("minus-five"), -5)},
		{Body: "fraction", DueMs: 1767225600000, Score: "1767225600000.75", MessageID: shard.MessageID([]byte("fraction"), 1767225600000)},
		{Body: "micros", DueMs: 1767225600000000, Score: "1767225600000000", MessageID: shard.MessageID([]byte("micros"), 1767225600000000)},
		{Body: "plus-inf", Score: "+inf", Never: true},
	}
	if len(p.Tasks) != len(want) {
		t.Fatalf("%d tasks, want %d: %+v", len(p.Tasks), len(want), p.Tasks)
	}
	for n, w := range want {
		w.Entry, w.Member = w.Body, w.Body
		if !sameTask(p.Tasks[n], w) {
			t.Errorf("task %d: %+v, want %+v", n, p.Tasks[n], w)
		}
	}
}

// TestListIDBodyAndProperties: pending tasks show the body and properties
// of their tasks and props fields (a task with a body field has an id;
// one with only properties is its own body), in-flight and dead ones those
// of their claimed fields; --match is on the member (the id); properties
// that are not JSON show as a JSON string. Pages larger than a read batch
// get every task's fields.
func TestListIDBodyAndProperties(t *testing.T) {
	rdb, k := setup(t)
	ctx := context.Background()
	const due = int64(1_800_000_000_000)
	pipe := rdb.Pipeline()
	for j := range 600 { // more than MaxRead per shard: several HMGETs per shard
		id := fmt.Sprintf("order-%03d", j)
		i := shard.Index([]byte(id), shards)
		pipe.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(due + int64(j)), Member: id})
		pipe.HSet(ctx, k.Tasks(i), id, "body of "+id)
		if j%2 == 0 {
			pipe.HSet(ctx, k.Props(i), id, fmt.Sprintf(`{"headers":{"n":%d}}`, j))
		}
	}
	plain := "plain-tick"
	pi := shard.Index([]byte(plain), shards)
	pipe.ZAdd(ctx, k.Pending(pi), redis.Z{Score: float64(due + 1000), Member: plain})
	pipe.HSet(ctx, k.Props(pi), plain, `{"type":"tick"}`)
	bare := "bare"
	bi := shard.Index([]byte(bare), shards)
	pipe.ZAdd(ctx, k.Pending(bi), redis.Z{Score: float64(due + 1001), Member: bare})
	// In flight and dead: the claimed fields, by entry. A second scheduling
	// of the same id pending meanwhile has its own body.
	for _, st := range []State{Inflight, Dead} {
		e := fmt.Sprintf("%d:job-%s", due, st)
		i := shard.Index([]byte("job-"+string(st)), shards)
		pipe.ZAdd(ctx, st.key(k, i), redis.Z{Score: float64(due), Member: e})
		pipe.HSet(ctx, k.ClaimedBody(i), e, "claimed body")
		pipe.HSet(ctx, k.ClaimedProps(i), e, `{"priority":`)
		pipe.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(due + 5000), Member: "job-" + string(st)})
		pipe.HSet(ctx, k.Tasks(i), "job-"+string(st), "newer body")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	all := []int{0, 1, 2, 3}
	p, err := Walk(ctx, rdb, Query{Keys: k, State: Pending, Shards: all, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Tasks) != 604 {
		t.Fatalf("%d pending tasks, want 604", len(p.Tasks))
	}
	for j, tk := range p.Tasks[:600] {
		id := fmt.Sprintf("order-%03d", j)
		wantProps := ""
		if j%2 == 0 {
			wantProps = fmt.Sprintf(`{"headers":{"n":%d}}`, j)
		}
		if tk.ID != id || tk.Member != id || tk.Body != "body of "+id || string(tk.Properties) != wantProps || tk.MessageID != shard.MessageID([]byte(id), due+int64(j)) {
			t.Fatalf("task %d: %+v", j, tk)
		}
	}
	if tk := p.Tasks[600]; tk.ID != "" || tk.Body != plain || string(tk.Properties) != `{"type":"tick"}` {
		t.Errorf("plain member with properties: %+v", tk)
	}
	if tk := p.Tasks[601]; tk.ID != "" || tk.Body != bare || tk.Properties != nil {
		t.Errorf("plain member: %+v", tk)
	}
	p, err = Walk(ctx, rdb, Query{Keys: k, State: Pending, Shards: all, Match: "order-12?"})
	if err != nil || len(p.Tasks) != 10 || p.Tasks[3].ID != "order-123" || p.Tasks[3].Body != "body of order-123" {
		t.Errorf("--match on the id: %v, %+v", err, p.Tasks)
	}
	if p, _ = Walk(ctx, rdb, Query{Keys: k, State: Pending, Shards: all, Match: "body*"}); len(p.Tasks) != 0 {
		t.Errorf("--match on the body matched %d tasks: it is on the member", len(p.Tasks))
	}
	for _, st := range []State{Inflight, Dead} {
		p, err := Walk(ctx, rdb, Query{Keys: k, State: st, Shards: all})
		if err != nil || len(p.Tasks) != 1 {
			t.Fatalf("%s: %v, %+v", st, err, p.Tasks)
		}
		tk := p.Tasks[0]
		b, err := json.Marshal(tk)
		if tk.ID != "job-"+string(st) || tk.Body != "claimed body" || err != nil ||
			!strings.Contains(string(b), `"id":"job-`+string(st)+`","body":"claimed body","properties":"{\"priority\":"`) {
			t.Errorf("%s: %+v, JSON %s", st, tk, b)
		}
	}
}
