package reshard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// DefaultHorizon: pending tasks due sooner than this are not moved. They
// are dispatched from where they are (every dispatcher serves the shards
// of both counts during a change), so no claim can take a task between a
// move's steps, and a dispatcher that has not yet noticed the change (the
// layout is polled every few seconds) has this long before a moved task
// falls due in a shard it does not yet serve.
const DefaultHorizon = 30 * time.Second

// Progress counts what passes of the mover found and did.
type Progress struct {
	Scanned int64 `json:"scanned"` // pending tasks looked at
	Moved   int64 `json:"moved"`   // pending tasks moved to their shard by the new count
	// Kept: the member was pending in both shards, with the new count's
	// copy kept (a producer on the new count wrote it).
	Kept int64 `json:"kept_new_copy"`
	// Raced: a producer on the old count rescheduled or cancelled the task
	// while it was being moved; the move was undone (a rescheduled one
	// moves on the next pass).
	Raced     int64 `json:"raced"`
	DeadMoved int64 `json:"dead_moved"`
	// Near: tasks in a shard other than theirs by the new count, due
	// within the horizon: they are dispatched where they are.
	Near int64 `json:"left_near_due"`
	// Retiring: what shards the new count no longer has still hold
	// (pending, in flight and dead), after the pass.
	Retiring int64 `json:"left_in_retiring_shards"`
}

func (p *Progress) add(o Progress) {
	p.Scanned += o.Scanned
	p.Moved += o.Moved
	p.Kept += o.Kept
	p.Raced += o.Raced
	p.DeadMoved += o.DeadMoved
	p.Near += o.Near
	p.Retiring += o.Retiring
}

// Mover moves a queue's pending tasks and dead letters to the shards the
// new shard count gives them, in bounded batches. Hold the lock (Lock)
// while passes run.
type Mover struct {
	RDB  redis.UniversalClient
	Keys shard.Keys
	// Horizon: tasks due sooner than this are left where they are
	// (DefaultHorizon); negative: move them too (shards nobody serves).
	Horizon time.Duration
	// Batch is the most tasks read or moved per Redis call (500).
	Batch int
}

// Pass moves every misplaced task of shards [0, span) once, by layout l.
// A shard that fails is reported in the error and the others are still
// moved.
func (m *Mover) Pass(ctx context.Context, l shard.Layout, from, span int) (Progress, error) {
	var total Progress
	var errs []string
	for i := from; i < span; i++ {
		p, err := m.shard(ctx, l, i)
		total.add(p)
		if err != nil {
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return total, fmt.Errorf("queue %s: %s", m.Keys.Queue, strings.Join(errs, "; "))
	}
	return total, nil
}

type task struct {
	score  string
	member string
}

// shard moves shard i's misplaced pending tasks and dead letters.
func (m *Mover) shard(ctx context.Context, l shard.Layout, i int) (Progress, error) {
	var p Progress
	batch := m.Batch
	if batch <= 0 {
		batch = 500
	}
	now, err := m.RDB.Time(ctx).Result()
	if err != nil {
		return p, fmt.Errorf("shard %d: read the Redis clock: %w", i, err)
	}
	limit := now.Add(m.horizon()).UnixMilli()
	src := m.Keys.Pending(i)
	var cursor uint64
	for {
		page, next, err := m.RDB.ZScan(ctx, src, cursor, "", int64(batch)).Result()
		if err != nil {
			return p, fmt.Errorf("shard %d: scan %s: %w", i, src, err)
		}
		groups := map[int][]task{}
		for k := 0; k+1 < len(page); k += 2 {
			p.Scanned++
			j := shard.Index([]byte(page[k]), l.Shards)
			if j == i {
				continue
			}
			score, _ := strconv.ParseFloat(page[k+1], 64)
			// Compared as floats: int64(+inf) is the smallest int64, and a
			// task never due would count as due soon for ever.
			if m.Horizon >= 0 && score <= float64(limit) {
				p.Near++
				continue
			}
			groups[j] = append(groups[j], task{score: page[k+1], member: page[k]})
		}
		if err := m.moveGroups(ctx, i, groups, &p); err != nil {
			return p, err
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if err := m.dead(ctx, l, i, batch, &p); err != nil {
		return p, err
	}
	if i >= l.Shards {
		pipe := m.RDB.Pipeline()
		counts := []*redis.IntCmd{pipe.ZCard(ctx, src), pipe.ZCard(ctx, m.Keys.Inflight(i)), pipe.ZCard(ctx, m.Keys.Dead(i))}
		if _, err := pipe.Exec(ctx); err != nil {
			return p, fmt.Errorf("shard %d: count what is left: %w", i, err)
		}
		for _, c := range counts {
			p.Retiring += c.Val()
		}
	}
	return p, nil
}

func (m *Mover) horizon() time.Duration {
	if m.Horizon == 0 {
		return DefaultHorizon
	}
	return max(m.Horizon, 0)
}

// moveGroups moves a page's tasks from shard i to their shards, each
// step for all destinations in one pipelined round trip: a page's tasks
// spread over up to the shard count's destinations, and a round trip per
// destination and step made moving a million tasks take minutes.
func (m *Mover) moveGroups(ctx context.Context, i int, groups map[int][]task, p *Progress) error {
	if len(groups) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Once begun, a page's three steps run to their end even if ctx ends
	// (SIGTERM, or the lock lost), so that a stop leaves no task in two
	// shards; only a process that dies does, which the next pass mends.
	// A mover that lost its lock may run them while the next holder moves
	// the same tasks: the steps are safe for that (scripts.go).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	bs := make([]*batchMove, 0, len(groups))
	for j, ts := range groups {
		bs = append(bs, m.batch(i, j, ts))
	}
	steps := []struct {
		script *redis.Script
		call   func(b *batchMove) ([]string, []any)
		done   func(b *batchMove, c *redis.Cmd) error
	}{
		{addScript, func(b *batchMove) ([]string, []any) { return []string{b.dst, b.moving}, b.args }, func(b *batchMove, c *redis.Cmd) (err error) {
			if b.added, err = c.Int64Slice(); err != nil {
				return fmt.Errorf("move %d tasks from %s to %s: add: %w", len(b.ts), b.src, b.dst, err)
			}
			return nil
		}},
		{takeScript, func(b *batchMove) ([]string, []any) { return []string{b.src}, b.args[1:] }, func(b *batchMove, c *redis.Cmd) (err error) {
			if b.taken, err = c.Int64Slice(); err != nil {
				// Those added are in both shards now, with one score:
				// the next pass finishes their move.
				return fmt.Errorf("move %d tasks from %s to %s: remove from the source: %w", len(b.ts), b.src, b.dst, err)
			}
			return nil
		}},
		{undoScript, func(b *batchMove) ([]string, []any) { return []string{b.dst, b.moving}, b.undoArgs(p) }, func(b *batchMove, c *redis.Cmd) error {
			if err := c.Err(); err != nil {
				return fmt.Errorf("undo moves to %s (raced by producers): %w", b.dst, err)
			}
			return nil
		}},
	}
	for _, st := range steps {
		cmds, err := runPipelined(ctx, m.RDB, st.script, len(bs), func(n int) ([]string, []any) { return st.call(bs[n]) })
		if err != nil {
			return err
		}
		for n, c := range cmds {
			if err := st.done(bs[n], c); err != nil {
				return err
			}
		}
	}
	return nil
}

// runPipelined runs script n times in one pipeline, with the keys and
// arguments call gives; calls refused with NOSCRIPT (a server that lost
// its script cache, a new primary) run again with the script's source.
func runPipelined(ctx context.Context, rdb redis.UniversalClient, script *redis.Script, n int, call func(n int) ([]string, []any)) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, n)
	pipe := rdb.Pipeline()
	for k := range n {
		keys, args := call(k)
		cmds[k] = script.EvalSha(ctx, pipe, keys, args...)
	}
	_, _ = pipe.Exec(ctx)
	var again []int
	for k, c := range cmds {
		if c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, k)
		}
	}
	if len(again) > 0 {
		pipe := rdb.Pipeline()
		for _, k := range again {
			keys, args := call(k)
			cmds[k] = script.Eval(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	return cmds, ctx.Err()
}

// batchMove is one batch's move from shard i to shard j, run a step at a
// time: add, take, undo (scripts.go). A test interleaves the steps with
// producers.
type batchMove struct {
	rdb      redis.UniversalClient
	src, dst string
	moving   string // the destination's moving hash
	ts       []task
	args     []any   // score1, member1, ...
	added    []int64 // addScript's flags
	taken    []int64 // takeScript's flags
}

func (m *Mover) batch(i, j int, ts []task) *batchMove {
	b := &batchMove{rdb: m.RDB, src: m.Keys.Pending(i), dst: m.Keys.Pending(j), moving: m.Keys.Moving(j), ts: ts,
		args: make([]any, 0, 2*len(ts)+1)}
	b.args = append(b.args, movingTTL.Milliseconds())
	for _, t := range ts {
		b.args = append(b.args, t.score, t.member)
	}
	return b
}

// add is step 1, on the destination.
func (b *batchMove) add(ctx context.Context) error {
	var err error
	if b.added, err = addScript.Run(ctx, b.rdb, []string{b.dst, b.moving}, b.args...).Int64Slice(); err != nil {
		return fmt.Errorf("move %d tasks from %s to %s: add: %w", len(b.ts), b.src, b.dst, err)
	}
	return nil
}

// take is step 2, on the source.
func (b *batchMove) take(ctx context.Context) error {
	var err error
	if b.taken, err = takeScript.Run(ctx, b.rdb, []string{b.src}, b.args[1:]...).Int64Slice(); err != nil {
		// Those added are in both shards now, with one score: the next
		// pass finishes their move.
		return fmt.Errorf("move %d tasks from %s to %s: remove from the source: %w", len(b.ts), b.src, b.dst, err)
	}
	return nil
}

// undo is step 3, on the destination: it undoes the adds whose source
// removal did not happen, unlists the batch's members from the moving
// hash (also those a mover that died listed), and counts the batch's
// outcome into p.
func (b *batchMove) undo(ctx context.Context, p *Progress) error {
	args := b.undoArgs(p)
	if err := undoScript.Run(ctx, b.rdb, []string{b.dst, b.moving}, args...).Err(); err != nil {
		return fmt.Errorf("undo moves to %s (raced by producers): %w", b.dst, err)
	}
	return nil
}

// undoArgs are undoScript's arguments after steps 1 and 2; it counts the
// batch's outcome into p.
func (b *batchMove) undoArgs(p *Progress) []any {
	var args []any
	for k, t := range b.ts {
		switch {
		case b.taken[k] == 1 && b.added[k] == 1:
			p.Moved++
		case b.taken[k] == 1:
			p.Kept++
		default:
			p.Raced++
		}
		flag := 0
		if b.added[k] == 1 && b.taken[k] != 1 {
			flag = 1
		}
		args = append(args, t.score, t.member, flag)
	}
	return args
}

// dead moves shard i's misplaced dead letters with their reasons.
func (m *Mover) dead(ctx context.Context, l shard.Layout, i, batch int, p *Progress) error {
	src := m.Keys.Dead(i)
	var cursor uint64
	for {
		page, next, err := m.RDB.ZScan(ctx, src, cursor, "", int64(batch)).Result()
		if err != nil {
			return fmt.Errorf("shard %d: scan %s: %w", i, src, err)
		}
		groups := map[int][]task{}
		for k := 0; k+1 < len(page); k += 2 {
			_, member, ok := strings.Cut(page[k], ":")
			if !ok {
				continue
			}
			if j := shard.Index([]byte(member), l.Shards); j != i {
				groups[j] = append(groups[j], task{score: page[k+1], member: page[k]})
			}
		}
		if err := m.moveDead(ctx, i, groups, p); err != nil {
			return err
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// moveDead moves a page's dead letters from shard i to their shards in
// the steps of deadMove, each step for all destinations in one pipelined
// round trip, to their end once begun (as moveGroups).
func (m *Mover) moveDead(ctx context.Context, i int, groups map[int][]task, p *Progress) error {
	if len(groups) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	ds := make([]*deadMove, 0, len(groups))
	for j, ts := range groups {
		ds = append(ds, m.deadBatch(i, j, ts))
	}
	pipe := m.RDB.Pipeline()
	reads := make([]*redis.SliceCmd, len(ds))
	for n, d := range ds {
		reads[n] = d.readCmd(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx)
	for n, d := range ds {
		if err := d.readDone(reads[n]); err != nil {
			return err
		}
	}
	if err := runSteps(ctx, m.RDB, deadSteps, ds); err != nil {
		return err
	}
	for _, d := range ds {
		p.DeadMoved += d.moved
	}
	return nil
}

// deadMove is one batch's move of dead letters (entries "<due>:<member>",
// with their reasons) from shard i to shard j: read the reasons on the
// source, then the three steps of scripts.go (add, take, undo).
type deadMove struct {
	rdb                              redis.UniversalClient
	src, srcWhy, dst, dstWhy, moving string
	ts                               []task   // score, entry
	why                              []string // the reasons read ("": none)
	added, taken                     []int64
	moved                            int64 // taken out of the source
}

func (m *Mover) deadBatch(i, j int, ts []task) *deadMove {
	return &deadMove{rdb: m.RDB, src: m.Keys.Dead(i), srcWhy: m.Keys.DeadReason(i), dst: m.Keys.Dead(j), dstWhy: m.Keys.DeadReason(j),
		moving: m.Keys.DeadMoving(j), ts: ts}
}

func (d *deadMove) readCmd(ctx context.Context, c redis.Cmdable) *redis.SliceCmd {
	entries := make([]string, len(d.ts))
	for k, t := range d.ts {
		entries[k] = t.member
	}
	return c.HMGet(ctx, d.srcWhy, entries...)
}

func (d *deadMove) readDone(c *redis.SliceCmd) error {
	vals, err := c.Result()
	if err == nil && len(vals) != len(d.ts) {
		err = fmt.Errorf("%d reasons for %d entries", len(vals), len(d.ts))
	}
	if err != nil {
		return fmt.Errorf("read dead-letter reasons of %s: %w", d.src, err)
	}
	d.why = make([]string, len(vals))
	for k, v := range vals {
		d.why[k], _ = v.(string)
	}
	return nil
}

// deadSteps are the steps after the read, as moveDead pipelines them.
var deadSteps = []step[*deadMove]{
	{addDeadScript, func(d *deadMove) ([]string, []any) {
		args := make([]any, 0, 1+3*len(d.ts))
		args = append(args, movingTTL.Milliseconds())
		for k, t := range d.ts {
			args = append(args, t.score, t.member, d.why[k])
		}
		return []string{d.dst, d.dstWhy, d.moving}, args
	}, func(d *deadMove, c *redis.Cmd) (err error) {
		if d.added, err = c.Int64Slice(); err != nil {
			return fmt.Errorf("move %d dead letters from %s to %s: %w", len(d.ts), d.src, d.dst, err)
		}
		return nil
	}},
	{takeDeadScript, func(d *deadMove) ([]string, []any) {
		args := make([]any, 0, 3*len(d.ts))
		for k, t := range d.ts {
			args = append(args, t.score, t.member, d.why[k])
		}
		return []string{d.src, d.srcWhy}, args
	}, func(d *deadMove, c *redis.Cmd) (err error) {
		if d.taken, err = c.Int64Slice(); err != nil {
			// Those added are in both shards, as read: the next pass
			// finishes their move.
			return fmt.Errorf("move %d dead letters from %s: remove from the source: %w", len(d.ts), d.src, err)
		}
		for _, f := range d.taken {
			if f == 1 {
				d.moved++
			}
		}
		return nil
	}},
	{undoDeadScript, func(d *deadMove) ([]string, []any) {
		args := make([]any, 0, 4*len(d.ts))
		for k, t := range d.ts {
			undo := 0
			if d.added[k] == 1 && d.taken[k] != 1 {
				undo = 1
			}
			args = append(args, t.score, t.member, d.why[k], undo)
		}
		return []string{d.dst, d.dstWhy, d.moving}, args
	}, func(d *deadMove, c *redis.Cmd) error {
		if err := c.Err(); err != nil {
			return fmt.Errorf("undo dead-letter moves to %s (requeued, purged or dead again meanwhile): %w", d.dst, err)
		}
		return nil
	}},
}

// steps are the batch's steps, one Redis call each (a test interleaves
// them with requeues and purges).
func (d *deadMove) steps() []func(context.Context) error {
	read := func(ctx context.Context) error { return d.readDone(d.readCmd(ctx, d.rdb)) }
	return append([]func(context.Context) error{read}, stepsOf(d.rdb, deadSteps, d)...)
}

// step is one step of a move between shards, one script on one shard
// per batch: call gives a batch's keys and arguments, done takes its reply.
type step[B any] struct {
	script *redis.Script
	call   func(b B) ([]string, []any)
	done   func(b B, c *redis.Cmd) error
}

// runSteps runs steps in order for batches bs, each step for all of them
// in one pipelined round trip.
func runSteps[B any](ctx context.Context, rdb redis.UniversalClient, steps []step[B], bs []B) error {
	for _, st := range steps {
		cmds, err := runPipelined(ctx, rdb, st.script, len(bs), func(n int) ([]string, []any) { return st.call(bs[n]) })
		if err != nil {
			return err
		}
		for n, c := range cmds {
			if err := st.done(bs[n], c); err != nil {
				return err
			}
		}
	}
	return nil
}

// stepsOf are steps for batch b alone, one Redis call each (tests
// interleave them with other writers).
func stepsOf[B any](rdb redis.UniversalClient, steps []step[B], b B) []func(context.Context) error {
	out := make([]func(context.Context) error, len(steps))
	for k, st := range steps {
		out[k] = func(ctx context.Context) error {
			keys, args := st.call(b)
			return st.done(b, st.script.Run(ctx, rdb, keys, args...))
		}
	}
	return out
}
