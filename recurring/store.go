package recurring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/coalesce"
	"github.com/dispatcher/dispatcher/shard"
)

// Store reads and changes one queue's schedules in Redis. Definitions and
// statuses live under the queue's hash tag {Q}; what was materialised
// lives beside each body's shard (state.go).
type Store struct {
	rdb  redis.UniversalClient
	keys shard.Keys
}

// NewStore returns the store of keys' queue.
func NewStore(rdb redis.UniversalClient, keys shard.Keys) *Store {
	return &Store{rdb: rdb, keys: keys}
}

// ErrNotFound: no schedule of that name.
var ErrNotFound = errors.New("no such recurring schedule")

// Status is what the materialiser last did for a schedule.
type Status struct {
	// Home is the shard index whose state hash holds the schedule's state
	// (-1 before the first materialisation); with a change of the shard
	// count it tells the materialiser where to look.
	Home   int   `json:"home"`
	Rev    int64 `json:"rev"`
	LastMs int64 `json:"last_ms,omitempty"` // due time of the last occurrence that left pending
	NextMs int64 `json:"next_ms,omitempty"` // due time of the occurrence pending, or to be materialised next
	// Error says why the schedule cannot be materialised (bad definition,
	// Redis refusing the script, a task with the same body in the way).
	Error string `json:"error,omitempty"`
	AtMs  int64  `json:"at_ms"` // when this was written (Redis clock)
}

// Entry is a definition with its status, as `recurring list` shows it.
type Entry struct {
	Def
	Status *Status `json:"status,omitempty"`
}

// Rev reads the queue's revision counter: it changes with every change of
// a definition. With via (one Redis only, node ""), the read goes in via's
// next round trip, with the other queues' reads of the moment.
func (s *Store) Rev(ctx context.Context, via *coalesce.Coalescer) (int64, error) {
	if via == nil {
		return s.rev(s.rdb.Get(ctx, s.keys.RecurringRev()))
	}
	var cmd *redis.StringCmd
	if _, _, err := via.Do(ctx, "", func(p redis.Pipeliner) { cmd = p.Get(ctx, s.keys.RecurringRev()) }); err != nil {
		return 0, fmt.Errorf("read %s: %w", s.keys.RecurringRev(), err)
	}
	return s.rev(cmd)
}

func (s *Store) rev(cmd *redis.StringCmd) (int64, error) {
	v, err := cmd.Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", s.keys.RecurringRev(), err)
	}
	return v, nil
}

// decode reads a stored definition, "<rev> <JSON>".
func decode(name, v string) (Def, error) {
	revS, js, ok := strings.Cut(v, " ")
	rev, err := strconv.ParseInt(revS, 10, 64)
	if !ok || err != nil {
		return Def{}, fmt.Errorf("%w: stored value of %s is not \"<rev> <json>\"", ErrInvalid, name)
	}
	var d Def
	if err := json.Unmarshal([]byte(js), &d); err != nil {
		return Def{}, fmt.Errorf("%w: stored value of %s: %v", ErrInvalid, name, err)
	}
	d.Name, d.Rev = name, rev
	return d, nil
}

// Defs reads every definition of the queue, by name. One that cannot be
// decoded comes back with its error in bad.
func (s *Store) Defs(ctx context.Context) (defs []Def, bad map[string]error, err error) {
	raw, err := s.rdb.HGetAll(ctx, s.keys.Recurring()).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", s.keys.Recurring(), err)
	}
	bad = map[string]error{}
	for name, v := range raw {
		d, err := decode(name, v)
		if err != nil {
			bad[name] = err
			continue
		}
		d.Queue = s.keys.Queue
		defs = append(defs, d)
	}
	sort.Slice(defs, func(i, j int) bool { return defs[i].Name < defs[j].Name })
	return defs, bad, nil
}

// Statuses reads every schedule's status, by name.
func (s *Store) Statuses(ctx context.Context) (map[string]Status, error) {
	raw, err := s.rdb.HGetAll(ctx, s.keys.RecurringStatus()).Result()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", s.keys.RecurringStatus(), err)
	}
	out := make(map[string]Status, len(raw))
	for name, v := range raw {
		var st Status
		if json.Unmarshal([]byte(v), &st) == nil {
			out[name] = st
		}
	}
	return out, nil
}

// List reads every definition with its status.
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	defs, bad, err := s.Defs(ctx)
	if err != nil {
		return nil, err
	}
	sts, err := s.Statuses(ctx)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, d := range defs {
		e := Entry{Def: d}
		if st, ok := sts[d.Name]; ok {
			e.Status = &st
		}
		out = append(out, e)
	}
	for name, err := range bad {
		out = append(out, Entry{Def: Def{Queue: s.keys.Queue, Name: name}, Status: &Status{Home: -1, Error: err.Error()}})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// sameSpec reports whether a and b materialise the same occurrences of
// the same body (pause and ownership aside).
func sameSpec(a, b Def) bool {
	return a.Cron == b.Cron && a.TZ == b.TZ && a.Body == b.Body && a.Properties == b.Properties && a.CatchUp == b.CatchUp && a.Grace == b.Grace
}

// Put adds or changes a definition; the caller validated it with Parse.
// It reports whether anything changed (an equal definition is left as
// it is, so reconciling an unchanged file costs no revision). When the
// body changes, the occurrence the old body has pending is cancelled
// (if it has not left pending yet) and the old state retired: the new
// body starts after the later of now and the last occurrence delivered.
func (s *Store) Put(ctx context.Context, d Def) (bool, error) {
	return s.change(ctx, d.Name, func(old *Def, _ bool) (*Def, bool) {
		if old != nil && sameSpec(*old, d) && old.Paused == d.Paused && old.Source == d.Source {
			return nil, false
		}
		return &d, true
	})
}

// SetPaused pauses or resumes a schedule. A paused schedule materialises
// nothing, and the occurrence it had pending is cancelled if it has not
// left pending yet; resumed, it goes on with the first occurrence after
// now (what fell due while paused is skipped, whatever its policy).
func (s *Store) SetPaused(ctx context.Context, name string, paused bool) (bool, error) {
	return s.change(ctx, name, func(old *Def, _ bool) (*Def, bool) {
		if old == nil || old.Paused == paused {
			return nil, false
		}
		d := *old
		d.Paused = paused
		return &d, true
	})
}

// Remove deletes a schedule and cancels the occurrence it has pending if
// that has not left pending yet.
func (s *Store) Remove(ctx context.Context, name string) (bool, error) {
	return s.change(ctx, name, func(_ *Def, exists bool) (*Def, bool) { return nil, exists })
}

// change applies f to the current definition of name (nil if none) by
// compare-and-set, retrying a few times if another change raced it; f
// also learns whether a value exists (one that cannot be decoded is no
// old definition, but can be removed), and returns the new definition
// (nil removes it) and whether to write.
func (s *Store) change(ctx context.Context, name string, f func(old *Def, exists bool) (*Def, bool)) (bool, error) {
	for try := 0; try < 5; try++ {
		cur, err := s.rdb.HGet(ctx, s.keys.Recurring(), name).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, fmt.Errorf("read %s %s: %w", s.keys.Recurring(), name, err)
		}
		var old *Def
		if cur != "" {
			d, err := decode(name, cur)
			if err == nil {
				d.Queue = s.keys.Queue
				old = &d
			}
		}
		nd, write := f(old, cur != "")
		if !write {
			if cur == "" {
				return false, fmt.Errorf("%s/%s: %w", s.keys.Queue, name, ErrNotFound)
			}
			return false, nil
		}
		js := ""
		if nd != nil {
			c := *nd
			c.Queue, c.Name, c.Rev = "", "", 0 // kept by the hash field and the value's prefix
			b, err := json.Marshal(c)
			if err != nil {
				return false, fmt.Errorf("encode %s/%s: %w", s.keys.Queue, name, err)
			}
			js = string(b)
		}
		res, err := putScript.Run(ctx, s.rdb, []string{s.keys.Recurring(), s.keys.RecurringRev()}, name, js, cur).Slice()
		if err != nil {
			return false, fmt.Errorf("write %s %s: %w", s.keys.Recurring(), name, err)
		}
		if res[0].(int64) == 0 {
			continue // raced by another change: read again
		}
		rev := res[1].(int64)
		if old != nil && (nd == nil || nd.Body != old.Body) {
			if err := s.retireBody(ctx, name, []byte(old.Body), rev); err != nil {
				return true, err
			}
		}
		if nd == nil {
			_ = s.rdb.HDel(ctx, s.keys.RecurringStatus(), name).Err() // the list shows it no longer; rewritten by nobody
		}
		return true, nil
	}
	return false, fmt.Errorf("change %s/%s: raced by other changes 5 times", s.keys.Queue, name)
}

// retireBody retires the state of name in every shard body may have it
// in, cancelling the occurrence it has pending if that has not left
// pending yet, at revision rev (a materialiser still holding the old
// definition then finds a newer revision and reads the definitions again).
func (s *Store) retireBody(ctx context.Context, name string, body []byte, rev int64) error {
	l, err := shard.ReadLayout(ctx, s.rdb, s.keys)
	if err != nil && !errors.Is(err, shard.ErrNoLayout) {
		return err
	}
	home := -1
	if v, err := s.rdb.HGet(ctx, s.keys.RecurringStatus(), name).Result(); err == nil {
		var st Status
		if json.Unmarshal([]byte(v), &st) == nil {
			home = st.Home
		}
	}
	for _, i := range candidates(body, l, home) {
		if _, err := retire(ctx, s.rdb, s.keys, i, name, body, rev); err != nil {
			return err
		}
	}
	return nil
}

// retire runs retireScript on shard i until it applies or finds no live
// state or a state at rev or later; it reports whether an occurrence was
// cancelled.
func retire(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, i int, name string, body []byte, rev int64) (bool, error) {
	for try := 0; try < 5; try++ {
		cur, err := rdb.HGet(ctx, keys.RecurringState(i), name).Result()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read %s %s: %w", keys.RecurringState(i), name, err)
		}
		st, ok := parseState(cur)
		if ok && st.rev >= rev {
			return false, nil
		}
		res, err := retireScript.Run(ctx, rdb, []string{keys.Pending(i), keys.RecurringState(i), keys.Tasks(i), keys.Props(i)}, name, body, cur, rev).Slice()
		if err != nil {
			return false, fmt.Errorf("retire %s on %s: %w", name, keys.RecurringState(i), err)
		}
		if res[0].(int64) == 1 {
			return res[1].(int64) == 1, nil
		}
	}
	return false, fmt.Errorf("retire %s on %s: raced 5 times", name, keys.RecurringState(i))
}

// candidates are the shards a schedule's state may be in: its body's
// shard by the layout's counts (the new and, during a change, the old;
// after a shrink, the retired one) and the shard it was last seen in.
func candidates(body []byte, l shard.Layout, home int) []int {
	var out []int
	add := func(i int) {
		for _, j := range out {
			if j == i {
				return
			}
		}
		out = append(out, i)
	}
	for _, m := range []int{l.Shards, l.From, l.Retired} {
		if m > 0 {
			add(shard.Index(body, m))
		}
	}
	if home >= 0 {
		add(home)
	}
	return out
}

// state is a parsed state field.
type state struct {
	rev    int64
	cursor int64 // ms
	flag   string
}

func (st state) String() string { return fmt.Sprintf("%d:%d:%s", st.rev, st.cursor, st.flag) }

// Flags of a state.
const (
	live    = ""
	frozen  = "f"
	retired = "r"
)

func parseState(v string) (state, bool) {
	parts := strings.Split(v, ":")
	if len(parts) != 3 {
		return state{}, false
	}
	rev, err1 := strconv.ParseInt(parts[0], 10, 64)
	cur, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return state{}, false
	}
	return state{rev: rev, cursor: cur, flag: parts[2]}, true
}

// ms converts a Redis-clock ms value to a time.
func ms(v int64) time.Time { return time.UnixMilli(v) }
