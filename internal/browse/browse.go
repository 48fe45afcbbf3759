// Package browse walks the tasks of one queue's state (pending, in flight
// or dead) across its shards in order, a page at a time: every Redis call
// reads at most MaxRead entries of one shard, the shards' streams are
// merged in order, and a Cursor lets the next walk go on where the last
// stopped. However large the queue, no call holds Redis and no walk reads
// a whole set.
package browse

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/glob"
	"github.com/dispatcher/dispatcher/shard"
)

// State is one of the sets a queue's tasks are in.
type State string

// The states a walk can list. Pending and dead tasks are walked by due
// time (their score); in-flight ones by lease deadline, their score: the
// set has no order by due time, and a walk by lease shows what the
// dispatchers will take again first.
const (
	Pending  State = "pending"
	Inflight State = "inflight"
	Dead     State = "dead"
)

// States are the states, in the order a task goes through them.
var States = []State{Pending, Inflight, Dead}

// ParseState reads a state's name.
func ParseState(s string) (State, error) {
	for _, st := range States {
		if s == string(st) {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown state %q: want pending, inflight or dead", s)
}

// key is the sorted set of state on shard i.
func (st State) key(k shard.Keys, i int) string {
	switch st {
	case Inflight:
		return k.Inflight(i)
	case Dead:
		return k.Dead(i)
	}
	return k.Pending(i)
}

// Task is one task as a walk found it.
type Task struct {
	Shard     int    `json:"shard"`
	DueMs     int64  `json:"due_ms"`
	MessageID string `json:"message_id"`
	// ID is the member when it is a task id: a pending member with a
	// field in the tasks hash, an in-flight or dead entry with a claimed
	// body. "" for a member that is its own body.
	ID string `json:"id,omitempty"`
	// Body is the message body: the id's stored body, or the member.
	Body string `json:"body"`
	// Properties are the task's properties as stored (see PropsJSON), nil
	// if it has none.
	Properties json.RawMessage `json:"properties,omitempty"`
	// Score is a pending task's score as Redis holds it ("+inf", "-5").
	Score string `json:"score,omitempty"`
	// Never: a pending task scored +inf or above 2^53 ms, never due: it
	// has no due time and no message_id.
	Never bool `json:"never_due,omitempty"`
	// LeaseMs is an in-flight task's lease deadline: when any instance
	// may hand it out again.
	LeaseMs int64 `json:"lease_ms,omitempty"`
	// Attempts counts an in-flight task's failed publishes.
	Attempts int `json:"attempts,omitempty"`
	// Reason says why a dead task died.
	Reason string `json:"reason,omitempty"`
	// Member is the task's member: its id, or the body itself.
	Member string `json:"-"`
	// Entry is the set member: the member, or "<due_ms>:<member>" in
	// flight and dead.
	Entry string `json:"-"`
}

// PropsJSON is stored properties as JSON output shows them: the object
// as stored, or, when the stored value is not valid JSON (such a task is
// dead-lettered for it), that value as a JSON string, so that it can be
// seen and the output stays JSON.
func PropsJSON(stored string) json.RawMessage {
	if json.Valid([]byte(stored)) {
		return json.RawMessage(stored)
	}
	b, _ := json.Marshal(stored)
	return b
}

// DefaultLimit and DefaultBudget are a Query's Limit and Budget when
// not given.
const (
	DefaultLimit  = 100
	DefaultBudget = 100_000
)

// Query is one walk.
type Query struct {
	Keys  shard.Keys
	State State
	// Shards are the shards to walk: during a change of the shard count,
	// those of both counts.
	Shards []int
	// From and To bound the due time (ms, inclusive); nil for none.
	From, To *int64
	// Match is a glob (Redis's MATCH) on the member (the task id, or the
	// body of a task without one); "" matches all. Walk refuses one
	// glob.Check refuses.
	Match string
	// Limit is the most tasks a page holds (default DefaultLimit).
	Limit int
	// Budget is the most entries a walk looks at (default DefaultBudget,
	// at least Limit): a selective Match on a huge queue then ends with a
	// cursor instead of running on without output.
	Budget int
	// After continues the walk of an earlier page.
	After *Cursor
}

// Page is what one walk found.
type Page struct {
	Tasks []Task
	// Next continues the walk; nil when it went through every shard.
	Next *Cursor
	// Scanned counts the entries looked at, matching or not.
	Scanned int
}

// source is one shard's stream of entries, read a batch at a time.
type source struct {
	shard int
	key   string
	buf   []redis.Z
	more  bool // the last read was a full batch
}

// Walk returns the next page of q.
func Walk(ctx context.Context, rdb redis.UniversalClient, q Query) (Page, error) {
	if q.After != nil && q.After.State != q.State {
		return Page{}, fmt.Errorf("cursor %s is of %s tasks, not %s", q.After, q.After.State, q.State)
	}
	if err := glob.Check(q.Match); err != nil {
		return Page{}, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	budget := q.Budget
	if budget <= 0 {
		budget = DefaultBudget
	}
	budget = max(budget, limit)
	sp := All
	if q.State != Inflight { // their score is the due time
		if q.From != nil {
			sp.Min = Bound{Score: float64(*q.From)}
		}
		if q.To != nil {
			sp.Max = Bound{Score: float64(*q.To)}
		}
	}
	srcs, err := openSources(ctx, rdb, q, sp, min(MaxRead, max(8, 4096/max(1, len(q.Shards)))))
	if err != nil {
		return Page{}, err
	}
	h := &merge{}
	for _, s := range srcs {
		if len(s.buf) > 0 {
			h.items = append(h.items, s)
		}
	}
	heap.Init(h)
	var page Page
	var last Cursor
	for h.Len() > 0 && len(page.Tasks) < limit && page.Scanned < budget {
		s := h.items[0]
		z := s.buf[0]
		s.buf = s.buf[1:]
		page.Scanned++
		member, _ := z.Member.(string)
		last = Cursor{State: q.State, Shard: s.shard, Pos: Pos{Score: z.Score, Member: member}}
		if t, ok := q.keep(s.shard, z.Score, member); ok {
			page.Tasks = append(page.Tasks, t)
		}
		if len(s.buf) == 0 && s.more {
			p := last.Pos
			if s.buf, s.more, err = Read(ctx, rdb, s.key, sp, Asc, &p, MaxRead); err != nil {
				return Page{}, err
			}
		}
		if len(s.buf) == 0 {
			heap.Pop(h)
		} else {
			heap.Fix(h, 0)
		}
	}
	if h.Len() > 0 {
		page.Next = &last
	}
	if err := q.annotate(ctx, rdb, page.Tasks); err != nil {
		return Page{}, err
	}
	return page, nil
}

// openSources reads the first batch of every shard, from the cursor if
// any, a few shards at a time.
func openSources(ctx context.Context, rdb redis.UniversalClient, q Query, sp Range, n int) ([]*source, error) {
	srcs := make([]*source, len(q.Shards))
	errs := make([]error, len(q.Shards))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for k, i := range q.Shards {
		s := &source{shard: i, key: q.State.key(q.Keys, i)}
		srcs[k] = s
		ssp, after := sp, (*Pos)(nil)
		if c := q.After; c != nil {
			// The merged order is (score, shard, member): shards before
			// the cursor's gave every entry of its score, shards after
			// it none.
			switch {
			case i < c.Shard:
				ssp = sp.from(Bound{Score: c.Score, Open: true})
			case i == c.Shard:
				after = &c.Pos
			default:
				ssp = sp.from(Bound{Score: c.Score})
			}
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.buf, s.more, errs[k] = Read(ctx, rdb, s.key, ssp, Asc, after, n)
		}()
	}
	wg.Wait()
	return srcs, errors.Join(errs...)
}

// keep makes a Task of an entry, if it passes q's filters.
func (q Query) keep(i int, score float64, member string) (Task, bool) {
	t := Task{Shard: i, Member: member, Entry: member}
	if q.State == Pending {
		t.DueMs, t.Never = shard.DueOf(score)
		t.Score = shard.FormatScore(score)
	} else {
		if q.State == Dead {
			t.DueMs = int64(score)
		}
		if due, m, ok := strings.Cut(member, ":"); ok {
			if ms, err := strconv.ParseInt(due, 10, 64); err == nil {
				t.DueMs, t.Member = ms, m
			}
		}
		if q.State == Inflight {
			t.LeaseMs = int64(score)
			if (q.From != nil && t.DueMs < *q.From) || (q.To != nil && t.DueMs > *q.To) {
				return Task{}, false
			}
		}
	}
	if q.Match != "" && !glob.Match(q.Match, t.Member) {
		return Task{}, false
	}
	t.Body = t.Member
	if !t.Never {
		t.MessageID = shard.MessageID([]byte(t.Member), t.DueMs)
	}
	return t, true
}

// annotate adds what the hashes beside the sets say of a page's tasks:
// the body and properties of a task with an id (pending: the tasks and
// props hashes by member; in flight and dead: the claimed ones by entry),
// attempts in flight, the reason of the dead. One HMGET per shard and hash
// (of up to MaxRead fields), all in one pipeline: a round trip per page.
func (q Query) annotate(ctx context.Context, rdb redis.UniversalClient, tasks []Task) error {
	type hashes struct{ body, props, extra func(int) string }
	var h hashes
	switch q.State {
	case Inflight:
		h = hashes{q.Keys.ClaimedBody, q.Keys.ClaimedProps, q.Keys.Attempts}
	case Dead:
		h = hashes{q.Keys.ClaimedBody, q.Keys.ClaimedProps, q.Keys.DeadReason}
	default:
		h = hashes{q.Keys.Tasks, q.Keys.Props, nil}
	}
	byShard := map[int][]int{}
	var order []int
	for n, t := range tasks {
		if byShard[t.Shard] == nil {
			order = append(order, t.Shard)
		}
		byShard[t.Shard] = append(byShard[t.Shard], n)
	}
	type read struct {
		batch              []int
		body, props, extra *redis.SliceCmd
	}
	var reads []read
	pipe := rdb.Pipeline()
	for _, i := range order {
		idx := byShard[i]
		for len(idx) > 0 {
			batch := idx[:min(len(idx), MaxRead)]
			idx = idx[len(batch):]
			fields := make([]string, len(batch))
			for k, n := range batch {
				fields[k] = tasks[n].Entry
			}
			r := read{batch: batch, body: pipe.HMGet(ctx, h.body(i), fields...), props: pipe.HMGet(ctx, h.props(i), fields...)}
			if h.extra != nil {
				r.extra = pipe.HMGet(ctx, h.extra(i), fields...)
			}
			reads = append(reads, r)
		}
	}
	if len(reads) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		for _, r := range reads {
			for _, c := range []*redis.SliceCmd{r.body, r.props, r.extra} {
				if c != nil && c.Err() != nil && !errors.Is(c.Err(), redis.Nil) {
					return fmt.Errorf("read %s: %w", c.Args()[1], c.Err())
				}
			}
		}
		return fmt.Errorf("read the bodies and properties of %s tasks: %w", q.State, err)
	}
	field := func(c *redis.SliceCmd, k int) (string, bool) {
		if c == nil || k >= len(c.Val()) {
			return "", false
		}
		s, ok := c.Val()[k].(string)
		return s, ok
	}
	for _, r := range reads {
		for k, n := range r.batch {
			t := &tasks[n]
			if b, ok := field(r.body, k); ok {
				t.ID, t.Body = t.Member, b
			}
			if p, ok := field(r.props, k); ok {
				t.Properties = PropsJSON(p)
			}
			s, _ := field(r.extra, k)
			switch q.State {
			case Dead:
				t.Reason = s
			case Inflight:
				t.Attempts, _ = strconv.Atoi(s)
			}
		}
	}
	return nil
}

// merge is a min-heap of the shards' streams by their next entry.
type merge struct{ items []*source }

func (m *merge) Len() int { return len(m.items) }
func (m *merge) Less(a, b int) bool {
	x, y := m.items[a], m.items[b]
	if x.buf[0].Score != y.buf[0].Score {
		return x.buf[0].Score < y.buf[0].Score
	}
	return x.shard < y.shard
}
func (m *merge) Swap(a, b int) { m.items[a], m.items[b] = m.items[b], m.items[a] }
func (m *merge) Push(x any)    { m.items = append(m.items, x.(*source)) }
func (m *merge) Pop() any {
	x := m.items[len(m.items)-1]
	m.items = m.items[:len(m.items)-1]
	return x
}
