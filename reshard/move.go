package reshard

import (
	"context"
	crand "crypto/rand"
	"crypto/sha1"
	"encoding/hex"
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
	// Raced: a producer on the old count rescheduled or cancelled the task,
	// or scheduled it again with another body or properties, while it was
	// being moved; the move was undone (a rescheduled one moves on the
	// next pass).
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
// destination and step made moving a million tasks take minutes. The
// mark of the tasks on the source (which reads their fields) goes first,
// in one round trip too.
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
	if err := runSteps(ctx, m.RDB, []step[*batchMove]{markStep}, bs); err != nil {
		return err
	}
	var parts []*batchMove
	for _, b := range bs {
		p.add(b.p) // what the mark left out
		b.p = Progress{}
		if len(b.ts) > 0 {
			parts = append(parts, b.split()...)
		}
	}
	if err := runSteps(ctx, m.RDB, moveSteps, parts); err != nil {
		return err
	}
	for _, b := range parts {
		p.add(b.p)
	}
	return nil
}

// readAll runs the reads of batches bs in one pipelined round trip.
func readAll[B any](ctx context.Context, rdb redis.UniversalClient, bs []B, read func(B, context.Context, redis.Cmdable) []*redis.SliceCmd,
	done func(B, []*redis.SliceCmd) error) error {
	pipe := rdb.Pipeline()
	cmds := make([][]*redis.SliceCmd, len(bs))
	for n, b := range bs {
		cmds[n] = read(b, ctx, pipe)
	}
	_, _ = pipe.Exec(ctx)
	for n, b := range bs {
		if err := done(b, cmds[n]); err != nil {
			return err
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

// fields are a task's body and properties as read on the source: a
// pending member's in :tasks / :props, an entry's in claimed:body /
// claimed:props.
type fields struct {
	has               int // 1: a body, 2: properties (bits)
	body, props       string
	bodySum, propsSum string // SHA1 in hex, "" if absent
}

// readFields takes the replies of HMGETs of the bodies and the
// properties of n fields.
func readFields(bodies, props *redis.SliceCmd, n int) ([]fields, error) {
	out := make([]fields, n)
	for h, c := range []*redis.SliceCmd{bodies, props} {
		vals, err := c.Result()
		if err == nil && len(vals) != n {
			err = fmt.Errorf("%d values for %d fields", len(vals), n)
		}
		if err != nil {
			return nil, fmt.Errorf("read the bodies and properties: %w", err)
		}
		for k, v := range vals {
			s, ok := v.(string)
			if !ok {
				continue
			}
			sum := sha1.Sum([]byte(s))
			out[k].has |= 1 << h
			if h == 0 {
				out[k].body, out[k].bodySum = s, hex.EncodeToString(sum[:])
			} else {
				out[k].props, out[k].propsSum = s, hex.EncodeToString(sum[:])
			}
		}
	}
	return out, nil
}

func (f fields) size() int { return len(f.body) + len(f.props) }

// moveBytes bounds what one call of a move's step carries (members,
// bodies and properties; one task at least): bodies of tasks with an id
// may be large, and a call of 500 of them would hold Redis.
const moveBytes = 1 << 20

// parts cuts n tasks into runs of at most moveBytes (size gives a task's
// bytes), one task at least each: it returns the runs' ends.
func parts(n int, size func(k int) int) []int {
	var ends []int
	sum := 0
	for k := range n {
		s := size(k)
		if sum > 0 && sum+s > moveBytes {
			ends = append(ends, k)
			sum = 0
		}
		sum += s
	}
	return append(ends, n)
}

// batchMove is one batch's move from shard i to shard j: mark the tasks
// on the source (reading their fields), then add, take, undo
// (scripts.go). A test interleaves the steps with producers.
type batchMove struct {
	rdb                redis.UniversalClient
	src, dst           string
	srcTasks, srcProps string
	dstTasks, dstProps string
	srcMoving, moving  string // the source's and the destination's moving hashes
	// token names the batch in the moving hashes: its steps act only on
	// what it listed itself, never on another batch's copy.
	token string
	ts    []task
	f     []fields // read on the source by the mark
	marks []int64  // markScript's flags, one per task read (before the cut)
	added []int64  // addScript's flags
	taken []int64  // takeScript's flags
	p     Progress // the batch's outcome, once taken
}

func (m *Mover) batch(i, j int, ts []task) *batchMove {
	return &batchMove{rdb: m.RDB, src: m.Keys.Pending(i), dst: m.Keys.Pending(j), srcMoving: m.Keys.Moving(i), moving: m.Keys.Moving(j),
		token: newToken(), ts: ts, srcTasks: m.Keys.Tasks(i), srcProps: m.Keys.Props(i), dstTasks: m.Keys.Tasks(j), dstProps: m.Keys.Props(j)}
}

// newToken is a batch's name in the moving hashes: 128 random bits, so no
// two batches share one.
func newToken() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// markStep is a batch's first step, on the source: markScript. The tasks
// it finds changed or gone since the scan are left out of the next steps
// (counted raced: the next pass moves them as they are now).
var markStep = step[*batchMove]{markScript, func(b *batchMove) ([]string, []any) {
	args := make([]any, 0, 2+2*len(b.ts))
	args = append(args, movingTTL.Milliseconds(), b.token)
	for _, t := range b.ts {
		args = append(args, t.score, t.member)
	}
	return []string{b.src, b.srcMoving, b.srcTasks, b.srcProps}, args
}, func(b *batchMove, c *redis.Cmd) error {
	vals, err := c.Slice()
	if err == nil && len(vals) != 3*len(b.ts) {
		err = fmt.Errorf("%d values for %d tasks", len(vals), len(b.ts))
	}
	if err != nil {
		return fmt.Errorf("move %d tasks from %s: mark them: %w", len(b.ts), b.src, err)
	}
	b.marks = make([]int64, len(b.ts))
	var ts []task
	var fs []fields
	for k, t := range b.ts {
		if flag, _ := vals[3*k].(int64); flag != 1 {
			b.p.Raced++
			continue
		}
		b.marks[k] = 1
		var f fields
		for h, v := range vals[3*k+1 : 3*k+3] {
			s, ok := v.(string)
			if !ok {
				continue
			}
			sum := sha1.Sum([]byte(s))
			f.has |= 1 << h
			if h == 0 {
				f.body, f.bodySum = s, hex.EncodeToString(sum[:])
			} else {
				f.props, f.propsSum = s, hex.EncodeToString(sum[:])
			}
		}
		ts, fs = append(ts, t), append(fs, f)
	}
	b.ts, b.f = ts, fs
	return nil
}}

// split cuts the batch, once marked, into batches of at most moveBytes.
func (b *batchMove) split() []*batchMove {
	ends := parts(len(b.ts), func(k int) int { return len(b.ts[k].member) + b.f[k].size() })
	if len(ends) == 1 {
		return []*batchMove{b}
	}
	out := make([]*batchMove, len(ends))
	lo := 0
	for n, hi := range ends {
		c := *b
		c.ts, c.f = b.ts[lo:hi], b.f[lo:hi]
		out[n], lo = &c, hi
	}
	return out
}

// moveSteps are a batch's steps after the read, as moveGroups pipelines
// them.
var moveSteps = []step[*batchMove]{
	{addScript, func(b *batchMove) ([]string, []any) {
		args := make([]any, 0, 2+5*len(b.ts))
		args = append(args, movingTTL.Milliseconds(), b.token)
		for k, t := range b.ts {
			args = append(args, t.score, t.member, b.f[k].has, b.f[k].body, b.f[k].props)
		}
		return []string{b.dst, b.moving, b.dstTasks, b.dstProps}, args
	}, func(b *batchMove, c *redis.Cmd) (err error) {
		if b.added, err = c.Int64Slice(); err != nil {
			return fmt.Errorf("move %d tasks from %s to %s: add: %w", len(b.ts), b.src, b.dst, err)
		}
		return nil
	}},
	{takeScript, func(b *batchMove) ([]string, []any) {
		args := make([]any, 0, 1+4*len(b.ts))
		args = append(args, b.token)
		for k, t := range b.ts {
			args = append(args, t.score, t.member, b.f[k].bodySum, b.f[k].propsSum)
		}
		return []string{b.src, b.srcMoving, b.srcTasks, b.srcProps}, args
	}, func(b *batchMove, c *redis.Cmd) (err error) {
		if b.taken, err = c.Int64Slice(); err != nil {
			// Those added are in both shards now, with one score and
			// their fields: the next pass finishes their move.
			return fmt.Errorf("move %d tasks from %s to %s: remove from the source: %w", len(b.ts), b.src, b.dst, err)
		}
		for k := range b.ts {
			switch {
			case b.taken[k] == 1 && b.added[k] == 1:
				b.p.Moved++
			case b.taken[k] == 1:
				b.p.Kept++
			default:
				b.p.Raced++
			}
		}
		return nil
	}},
	{undoScript, func(b *batchMove) ([]string, []any) {
		args := make([]any, 0, 1+5*len(b.ts))
		args = append(args, b.token)
		for k, t := range b.ts {
			undo := 0
			if b.added[k] == 1 && b.taken[k] != 1 {
				undo = 1
			}
			args = append(args, t.score, t.member, undo, b.f[k].bodySum, b.f[k].propsSum)
		}
		return []string{b.dst, b.moving, b.dstTasks, b.dstProps}, args
	}, func(b *batchMove, c *redis.Cmd) error {
		if err := c.Err(); err != nil {
			return fmt.Errorf("undo moves to %s (raced by producers): %w", b.dst, err)
		}
		return nil
	}},
}

// steps are the batch's steps, one Redis call each: mark, add, take,
// undo (a test interleaves them with producers).
func (b *batchMove) steps() []func(context.Context) error {
	return stepsOf(b.rdb, append([]step[*batchMove]{markStep}, moveSteps...), b)
}

// mark, add, take and undo are the batch's steps one by one; undo counts
// the batch's outcome (and the tasks the mark left out) into p.
func (b *batchMove) mark(ctx context.Context) error { return b.steps()[0](ctx) }
func (b *batchMove) add(ctx context.Context) error  { return b.steps()[1](ctx) }
func (b *batchMove) take(ctx context.Context) error { return b.steps()[2](ctx) }
func (b *batchMove) undo(ctx context.Context, p *Progress) error {
	if err := b.steps()[3](ctx); err != nil {
		return err
	}
	p.add(b.p)
	return nil
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
	if err := readAll(ctx, m.RDB, ds, (*deadMove).readCmds, (*deadMove).readDone); err != nil {
		return err
	}
	var parts []*deadMove
	for _, d := range ds {
		parts = append(parts, d.split()...)
	}
	if err := runSteps(ctx, m.RDB, deadSteps, parts); err != nil {
		return err
	}
	for _, d := range parts {
		p.DeadMoved += d.moved
	}
	return nil
}

// deadMove is one batch's move of dead letters (entries "<due>:<member>",
// with their reasons, bodies and properties) from shard i to shard j:
// read the reasons and fields on the source, then the three steps of
// scripts.go (add, take, undo).
type deadMove struct {
	rdb                              redis.UniversalClient
	src, srcWhy, dst, dstWhy, moving string
	srcBody, srcProps                string // claimed:body, claimed:props
	dstBody, dstProps                string
	ts                               []task   // score, entry
	why                              []string // the reasons read ("": none)
	f                                []fields // the fields read
	added, taken                     []int64
	moved                            int64 // taken out of the source
}

func (m *Mover) deadBatch(i, j int, ts []task) *deadMove {
	return &deadMove{rdb: m.RDB, src: m.Keys.Dead(i), srcWhy: m.Keys.DeadReason(i), dst: m.Keys.Dead(j), dstWhy: m.Keys.DeadReason(j),
		moving: m.Keys.DeadMoving(j), srcBody: m.Keys.ClaimedBody(i), srcProps: m.Keys.ClaimedProps(i),
		dstBody: m.Keys.ClaimedBody(j), dstProps: m.Keys.ClaimedProps(j), ts: ts}
}

func (d *deadMove) readCmds(ctx context.Context, c redis.Cmdable) []*redis.SliceCmd {
	entries := make([]string, len(d.ts))
	for k, t := range d.ts {
		entries[k] = t.member
	}
	return []*redis.SliceCmd{c.HMGet(ctx, d.srcWhy, entries...), c.HMGet(ctx, d.srcBody, entries...), c.HMGet(ctx, d.srcProps, entries...)}
}

func (d *deadMove) readDone(cmds []*redis.SliceCmd) error {
	vals, err := cmds[0].Result()
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
	if d.f, err = readFields(cmds[1], cmds[2], len(d.ts)); err != nil {
		return fmt.Errorf("dead letters of %s: %w", d.src, err)
	}
	return nil
}

// split cuts the batch, once read, into batches of at most moveBytes.
func (d *deadMove) split() []*deadMove {
	ends := parts(len(d.ts), func(k int) int { return len(d.ts[k].member) + len(d.why[k]) + d.f[k].size() })
	if len(ends) == 1 {
		return []*deadMove{d}
	}
	out := make([]*deadMove, len(ends))
	lo := 0
	for n, hi := range ends {
		c := *d
		c.ts, c.why, c.f = d.ts[lo:hi], d.why[lo:hi], d.f[lo:hi]
		out[n], lo = &c, hi
	}
	return out
}

// deadSteps are the steps after the read, as moveDead pipelines them.
var deadSteps = []step[*deadMove]{
	{addDeadScript, func(d *deadMove) ([]string, []any) {
		args := make([]any, 0, 1+6*len(d.ts))
		args = append(args, movingTTL.Milliseconds())
		for k, t := range d.ts {
			args = append(args, t.score, t.member, d.why[k], d.f[k].has, d.f[k].body, d.f[k].props)
		}
		return []string{d.dst, d.dstWhy, d.moving, d.dstBody, d.dstProps}, args
	}, func(d *deadMove, c *redis.Cmd) (err error) {
		if d.added, err = c.Int64Slice(); err != nil {
			return fmt.Errorf("move %d dead letters from %s to %s: %w", len(d.ts), d.src, d.dst, err)
		}
		return nil
	}},
	{takeDeadScript, func(d *deadMove) ([]string, []any) {
		args := make([]any, 0, 5*len(d.ts))
		for k, t := range d.ts {
			args = append(args, t.score, t.member, d.why[k], d.f[k].bodySum, d.f[k].propsSum)
		}
		return []string{d.src, d.srcWhy, d.srcBody, d.srcProps}, args
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
		args := make([]any, 0, 6*len(d.ts))
		for k, t := range d.ts {
			undo := 0
			if d.added[k] == 1 && d.taken[k] != 1 {
				undo = 1
			}
			args = append(args, t.score, t.member, d.why[k], undo, d.f[k].bodySum, d.f[k].propsSum)
		}
		return []string{d.dst, d.dstWhy, d.moving, d.dstBody, d.dstProps}, args
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
	read := func(ctx context.Context) error { return d.readDone(d.readCmds(ctx, d.rdb)) }
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
