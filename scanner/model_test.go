package scanner

// TestModel is a randomized, model-based test of the whole claim, publish,
// settle protocol: the real scripts (through store) on the real Redis,
// driven by producers, several instances with their own leases, lost
// replies, late and repeated settles, instance deaths, real time passing
// and wrong-type keys, against a model of what every scheduling must
// become. After every step it reads all keys of the queue and checks:
//
//   - exactness: the keys hold what the model predicts: pending members
//     and scores, in-flight entries and leases (a retry's backoff within
//     the TIME read before and after the script), attempt counts, dead
//     letters and reasons, and the :claim record, exactly: the "<token>
//     <deadline>" pairs of the shard's last claimRecords claims that
//     handed out at least one entry, newest last, with no expiry (absent
//     before the first such claim; a claim that hands out nothing leaves
//     it as it was);
//   - claims: every claim's lease deadline is exactly max(its server time
//     + its lease, the :claim record's deadline + 1), and no two claims of
//     a shard that handed something out have the same deadline
//     (COLLISION); every claim hands out exactly the entries
//     the model says (expired leases first, then due pending, oldest
//     first, up to the limit), with the reaped count and next times the
//     model says; a due pending member whose entry "<due>:<member>" is
//     already in flight leaves pending and merges into that entry (it
//     keeps its lease and holder, the claim does not hand it out; an entry
//     the same claim re-leased as expired is handed out once); every
//     script that meets a wrong-type key it checks fails with WRONGTYPE
//     and changes nothing;
//   - nothing lost: every scheduling that was ZADDed and not cancelled or
//     replaced (a ZADD of a pending member with another due replaces it)
//     while pending is in pending with its score or in flight as its
//     entry, or some publish of it was confirmed, or it is dead-lettered;
//     a scheduling already claimed is never replaced; a merged scheduling
//     is the same message_id as its entry and ends with it;
//   - nothing early: instances claim with a look-ahead (0, 40 or 150 ms,
//     with a lease that long longer): a claim hands out pending tasks due
//     within its own server time plus its look-ahead, and re-leased ones
//     (handed back, or whose lease ran out) due within the largest
//     look-ahead of the highest server time read so far. An instance
//     publishes as production does (dispatch, holder, clockCheck): at
//     once only what the claim's own reading of the server clock shows
//     due; a held task only once a reading taken after it was held shows
//     it due: a TIME it sends (a publish step), or a later claim's reading
//     of the shard. Every publish is checked against the server clock as
//     read at that moment (a TIME right after it): none may be early. A
//     stopping instance hands back (releases) what it holds; a cancel
//     finds a task only until a claim took it, ahead or not;
//   - duplicates only from the at-least-once window: a scheduling is
//     confirmed twice only when the batch that held it first lost its
//     lease to expiry by the server clock (its instance died or stalled,
//     its ack came after the lease, or the clock stepped forward past the
//     lease: counted apart); a producer's ZADD of the same member and due
//     while in flight never makes a second delivery, and no batch lists an
//     entry twice;
//   - fencing: the model's holder of an entry is the last claim that handed
//     it out, until it fails or releases it (a holder's lease is its
//     deadline); fail and release act exactly on the entries their batch
//     holds: one that acts on an entry it does not hold (its lease equals
//     the batch's deadline) fails with COLLISION and a FENCING diagnosis
//     of what set that lease; a claim run again with a token of the
//     shard's :claim record (also after later claims of the shard)
//     returns exactly the entries its first run still holds, whatever the
//     time (also after its lease ran out), and any other entry it returns
//     is a COLLISION; one whose token is no longer in the record claims
//     anew; a fail or release run again changes
//     nothing more (one attempt counted);
//   - tasks with an id: producers schedule a few ids as the contract
//     says (MULTI, HSET :tasks, HSET or HDEL :props, ZADD; a new body
//     each time), reschedule them (ZADD XX CH: only a pending id moves,
//     with its body) and cancel them (MULTI, ZREM, HDEL, HDEL), mixed
//     with the plain members and colliding with claims: scheduled again
//     with a new body while claimed, at the due of the in-flight entry
//     (the claim drops that copy's body: the entry keeps its own) or of
//     a dead letter, cancelled or rescheduled while in flight or held.
//     Every claim (fresh, re-leasing, or run again with its token) hands
//     out with each entry the body and properties the producer wrote for
//     the scheduling its first claim took, never an earlier or later one.
//     After every step :tasks and :props hold exactly the pending ids'
//     bodies and properties, and claimed:body and claimed:props exactly
//     the in-flight and dead entries' (an ack deletes them, a dead letter
//     keeps them); read on their own, the keys have no :tasks or :props
//     field whose member is not pending and no claimed field whose entry
//     is neither in flight nor dead. A stopping instance also unclaims
//     what it holds: an entry under its lease and never failed goes back
//     into pending with its body back under the id, unless its member is
//     pending again (then it is released and keeps its claimed body).
//     An instance stalls past its lease before an ack while the next
//     holder dead-letters the entry (deadline passed): the late ack must
//     leave the dead letter's body;
//   - nothing grows: attempts fields belong to in-flight entries,
//     dead:reason fields and dead entries match, the queue has no keys
//     but the six per shard, the retrying index and the four hashes of
//     ids (and the stash keys of moved-away data);
//   - at the end of each run: wrong-type keys restored, every instance
//     dead, one new instance claims and settles everything until pending
//     and in-flight are empty; then every scheduling was confirmed or
//     dead-lettered, unless cancelled or replaced while pending.
//
// Known findings, counted and logged by default, fatal with -model.strict.
// LEAK: an ack run while the attempts hash is moved away (renamed, a wrong-type
// key in its place) cannot delete its entries' attempts fields, which come
// back with the hash. The ack script skips HDEL on an attempts key that is
// not a hash on purpose (a wrong-type key must not keep delivered tasks in
// flight), and moving the hash away and back is not something the daemon
// must survive without a leftover count; the model tracks exactly those
// fields (a later ack of the same entry deletes them) and fails on any
// other. Everything else above is a hard failure.
//
// TestModel runs on the shared Redis, whose clock is left alone.
// TestModelClockSteps runs the same model on a private Redis whose wall
// clock (TIME, and the scripts' TIME) steps at random steps, back by up to
// 500 ms or forward by up to 400 ms, within 2 s of the true clock
// (testenv.ClockShift), as an NTP step or a failover to a primary whose
// clock is off would. Leases are in server time: a step back extends them,
// a step forward ends them early (a duplicate then is in the window
// above). Every check above holds as it is; the claims' deadlines after a
// step back come from the :claim record (its deadline + 1). With
// -model.byestimate its instances publish held tasks by their estimate of
// the clock (the last reading plus the time since), as before a reading
// taken after holding was required, and the model reports EARLY;
// TestModelClockStepsCatchesEstimate expects that report.
//
// Flags: -model.seed=N replays one seed, -model.duration=10m runs longer
// (25s by default for each test, split over seeds of -model.run each),
// -model.strict, -model.byestimate. A seed fixes every random choice; real
// time still decides which leases ran out, so a replay can diverge after a
// while.

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

var (
	modelSeed     = flag.Uint64("model.seed", 0, "TestModel, TestModelClockSteps: replay this seed only")
	modelDuration = flag.Duration("model.duration", 25*time.Second, "TestModel, TestModelClockSteps: total running time of each, split over seeds")
	modelRun      = flag.Duration("model.run", 2500*time.Millisecond, "TestModel: steps of one seed before it quiesces")
	modelStrict   = flag.Bool("model.strict", false,
		"TestModel: fail on the known finding (attempts fields left by an ack while the attempts hash was moved away) instead of counting it")
	modelByEstimate = flag.Bool("model.byestimate", false,
		"TestModelClockSteps: instances publish held tasks by their estimate of the Redis clock, as before a reading taken after holding was required; the model must then report EARLY")
)

const (
	mRetryMin    = 10 * time.Millisecond
	mRetryMax    = 80 * time.Millisecond
	mMaxAttempts = 3
	mLogSteps    = 20
)

var mLeases = []time.Duration{30 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond, 300 * time.Millisecond}
var mAheads = []time.Duration{0, 0, 40 * time.Millisecond, 150 * time.Millisecond}

// Kinds of key of a shard.
const (
	kPending = iota
	kInflight
	kAttempts
	kDead
	kReason
	kClaim
	nKinds
)

var kindNames = [nKinds]string{"pending", "inflight", "attempts", "dead", "dead:reason", "claim"}

type schedState int

const (
	sPending schedState = iota
	sInflight
	sConfirmed
	sDead
	sSuperseded
	sCancelled
)

var stateNames = []string{"pending", "in flight", "confirmed", "dead", "superseded", "cancelled"}

// mSched is one producer ZADD that created a scheduling.
type mSched struct {
	id     int
	shard  int
	member string
	due    int64
	state  schedState
	occ    *mOcc
	step   int
	// body and props are what the producer wrote with an id's
	// scheduling (string), or nil: a plain member, its own body.
	body, props any
}

func (s *mSched) String() string {
	return fmt.Sprintf("scheduling #%d (shard %d, %q due %d, ZADDed at step %d, %s)",
		s.id, s.shard, s.member, s.due, s.step, stateNames[s.state])
}

// mOcc is one stay of an entry in the in-flight set, from the claim that
// moved it there to the ack or dead-lettering that removed it. A pending
// scheduling of the same member and due claimed meanwhile merges into it
// (the same message_id): it leaves pending and joins the group, and the
// stay keeps its lease and holder.
type mOcc struct {
	id       int
	entry    string
	member   string
	due      int64
	lease    int64   // its score, less the half ms of a retry's lease (half)
	half     bool    // the score is lease + 0.5: a retry's backoff lease
	leaseBy  string  // what set the lease, for diagnoses
	holder   *mBatch // the last claim that handed it out, nil once that batch failed or released it
	group    []*mSched
	confirms []*mBatch // batches whose publish of it was confirmed
	// body and props are those of the scheduling the claim that moved it
	// to in-flight took (group[0]): every claim hands them out.
	body, props any
}

// expired reports whether a claim at server time now takes o over.
func (o *mOcc) expired(now int64) bool {
	if o.half {
		return o.lease < now
	}
	return o.lease <= now
}

// score2 is twice o's score, a whole number.
func (o *mOcc) score2() int64 {
	if o.half {
		return 2*o.lease + 1
	}
	return 2 * o.lease
}

func (o *mOcc) String() string {
	return fmt.Sprintf("%q (lease %d, holder %s)", o.entry, o.lease, o.holder)
}

// mBatch is what one claim handed out.
type mBatch struct {
	id        int
	inst      *mInst
	shard     int
	token     string
	now       int64
	deadline  int64
	entries   []string
	occs      []*mOcc
	outcome   []string // per task: "" until published
	settled   []bool
	lost      map[*mOcc]string // how the batch stopped holding an entry
	claimStep int
	shift     int64 // ms the Redis clock was stepped by when it claimed
}

func (b *mBatch) String() string {
	if b == nil {
		return "none"
	}
	return fmt.Sprintf("b%d(%s, claimed at %d step %d, deadline %d)", b.id, b.inst.name, b.now, b.claimStep, b.deadline)
}

func (b *mBatch) add(o *mOcc) {
	b.entries = append(b.entries, o.entry)
	b.occs = append(b.occs, o)
	b.outcome = append(b.outcome, "")
	b.settled = append(b.settled, false)
}

// mInst is a simulated dispatcher instance.
type mInst struct {
	name       string
	st         *store
	alive      bool
	batches    []*mBatch
	lostClaims []*mLostClaim
	reruns     []mRerun
	// readings is the last reading of each shard's Redis clock the
	// instance made (a claim's, or a TIME's): its estimate of the clock.
	readings map[int]mReading
}

// mReading is one reading of the Redis clock by an instance.
type mReading struct {
	server int64     // ms, what it read
	sent   time.Time // when its request was sent
}

// observe keeps a reading of shard i's clock if it is the latest.
func (in *mInst) observe(i int, server int64, sent time.Time) {
	if rd, ok := in.readings[i]; !ok || sent.After(rd.sent) {
		in.readings[i] = mReading{server, sent}
	}
}

// mLostClaim is a claim whose reply the instance never read; go-redis runs
// it again with the same token.
type mLostClaim struct {
	shard, limit int
	token        string
	first        *mBatch // what the first run claimed, nil if nothing
}

// mRerun is a settle whose reply was lost, to run again later.
type mRerun struct {
	b    *mBatch
	kind string
	idxs []int
}

type mWrong struct {
	moved bool // the real data was renamed to the stash key, to be put back
}

type mShard struct {
	i        int
	pending  map[string]*mSched
	inflight map[string]*mOcc
	attempts map[string]int
	dead     map[string]int64
	reason   map[string]string
	claims   []mLastClaim // the :claim record: the last claimRecords claims that handed something out, newest last
	wrong    [nKinds]*mWrong
	leaked   map[string]bool // attempts fields an ack could not delete
	everConf map[string]bool // entries some publish confirmed
	// deadlines are the lease deadlines of the shard's claims that handed
	// something out: no two may be equal.
	deadlines map[int64]*mBatch
	// deadBody and deadProps are the claimed body and properties a dead
	// entry keeps (absent: none).
	deadBody, deadProps map[string]any
}

type mLastClaim struct {
	token    string
	deadline int64
}

// lastClaim is the shard's last claim that handed something out (nil:
// none yet).
func (sh *mShard) lastClaim() *mLastClaim {
	if len(sh.claims) == 0 {
		return nil
	}
	return &sh.claims[len(sh.claims)-1]
}

// claimOf is the claim of the :claim record with this token (nil: none).
func (sh *mShard) claimOf(token string) *mLastClaim {
	for k := range sh.claims {
		if sh.claims[k].token == token {
			return &sh.claims[k]
		}
	}
	return nil
}

// record is what the :claim record must hold.
func (sh *mShard) record() string {
	var pairs []string
	for _, l := range sh.claims {
		pairs = append(pairs, l.token+" "+strconv.FormatInt(l.deadline, 10))
	}
	return strings.Join(pairs, " ")
}

func (sh *mShard) anyWrong(kinds ...int) bool {
	for _, k := range kinds {
		if sh.wrong[k] != nil {
			return true
		}
	}
	return false
}

// modelStats adds up what the runs did.
type modelStats struct {
	runs, steps int
	elapsed     time.Duration
	ops         map[string]int
	events      map[string]int
	// runStart is when the run under way began, zero between runs: the
	// summary counts a run that failed too.
	runStart time.Time
}

type mRun struct {
	t       *testing.T
	ctx     context.Context
	rdb     *redis.Client
	seed    uint64
	rng     *rand.Rand
	keys    shard.Keys
	shards  []*mShard
	insts   []*mInst
	scheds  []*mSched
	active  []*mSched
	members []string
	ids     int
	// idNames are the run's task ids: few, so that producers' schedules,
	// reschedules and cancels of them collide with claims.
	idNames []string
	isID    map[string]bool
	step    int
	log     []string
	cur     strings.Builder
	lastNow int64
	// hiNow is the highest server time read so far: the Redis clock may
	// have stepped back from it.
	hiNow int64
	// shift steps the Redis clock (TestModelClockSteps; nil: the shared
	// Redis, whose clock is left alone); shiftNow is the step it is set to.
	shift    *testenv.ClockShift
	shiftNow time.Duration
	// byEstimate: -model.byestimate, or a test that expects EARLY.
	byEstimate bool
	// catch: fatalf panics with a modelFailure instead of failing the test
	// (a test that expects the model to report a violation).
	catch bool
	name  string // the test's, for its messages
	stats *modelStats
	// knownFirst is the first occurrence in this run of each known finding.
	knownFirst map[string]string
}

// mConf is what sets one test's runs apart.
type mConf struct {
	name       string
	shift      *testenv.ClockShift // nil: the Redis clock is left alone
	byEstimate bool
	catch      bool
}

// TestModel: see the comment at the top of this file. It runs on the
// shared Redis, whose clock is left alone.
func TestModel(t *testing.T) {
	stats := modelRuns(t, testenv.Redis(t), mConf{name: "TestModel"})
	// An instance's flush acks several shards in one call: the model must
	// have done so too, wrong-type keys and lost replies among them.
	if stats.events["ack of several shards in one call"] == 0 {
		t.Errorf("no ack of several shards in one call was modelled")
	}
	// A lost claim run again after other claims of its shard (as when a
	// stalled primary resumes with several instances' claims) gets its
	// batch back: the model must have done so.
	if stats.events["claim run again after later claims of its shard"] == 0 {
		t.Errorf("no claim was run again after later claims of its shard")
	}
}

// TestModelClockSteps is TestModel on a private Redis whose clock steps
// back (up to 500 ms at a time) and forward (up to 400 ms) at random
// steps: see the comment at the top of this file.
func TestModelClockSteps(t *testing.T) {
	shift := testenv.NewClockShift(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{Env: shift.Env})
	stats := modelRuns(t, srv.Client(), mConf{name: "TestModelClockSteps", shift: shift, byEstimate: *modelByEstimate})
	// The clock must really have stepped, or this tested nothing more
	// than TestModel.
	if stats.events["Redis clock stepped back, as TIME read it"] == 0 {
		t.Errorf("no step back of the Redis clock was seen by TIME (steps set: %d)", stats.ops["Redis clock steps"])
	}
}

// TestModelClockStepsCatchesEstimate shows that the model's "nothing
// early" check is not idle: instances that publish held tasks by their
// estimate of the Redis clock, as before a reading taken after holding
// was required, publish before the due time by the clock as read at the
// publish once it stepped back, and the model must report it (EARLY).
func TestModelClockStepsCatchesEstimate(t *testing.T) {
	shift := testenv.NewClockShift(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{Env: shift.Env})
	rdb := srv.Client()
	stats := &modelStats{ops: map[string]int{}, events: map[string]int{}}
	conf := mConf{name: "TestModelClockStepsCatchesEstimate", shift: shift, byEstimate: true, catch: true}
	for n := 1; n <= 10; n++ {
		seed := rand.Uint64() | 1
		msg := catchModel(func() { runModel(t, rdb, seed, *modelRun, stats, conf) })
		switch {
		case strings.Contains(msg, "EARLY: "):
			t.Logf("run %d (seed %d): the model reported, as it must:\n%s", n, seed, firstLines(msg, 3))
			return
		case msg != "":
			t.Fatalf("run %d (seed %d): the model reported something other than EARLY:\n%s", n, seed, msg)
		}
		shift.Set(t, 0)
	}
	t.Fatalf("10 runs of instances publishing by their estimate while the Redis clock steps back: the model never reported EARLY")
}

// modelFailure is what fatalf panics with when the run's conf catches.
type modelFailure string

// catchModel runs f and returns the failure the model reported, if any.
func catchModel(f func()) (msg string) {
	defer func() {
		if x := recover(); x != nil {
			mf, ok := x.(modelFailure)
			if !ok {
				panic(x)
			}
			msg = string(mf)
		}
	}()
	f()
	return ""
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// modelRuns runs seeds for -model.duration (one with -model.seed) and
// logs what they did.
func modelRuns(t *testing.T, rdb *redis.Client, conf mConf) *modelStats {
	total := *modelDuration
	if testing.Short() && total > 3*time.Second {
		total = 3 * time.Second
	}
	stats := &modelStats{ops: map[string]int{}, events: map[string]int{}}
	start := time.Now()
	defer func() { // also when a run failed
		failed := ""
		if !stats.runStart.IsZero() {
			stats.runs++
			stats.elapsed += time.Since(stats.runStart)
			failed = " (the last one failed)"
		}
		el := time.Since(start)
		t.Logf("%s: %d runs%s, %d steps in %v (%.0f steps/s over the runs' own time %v)",
			conf.name, stats.runs, failed, stats.steps, el.Round(time.Millisecond), float64(stats.steps)/stats.elapsed.Seconds(), stats.elapsed.Round(time.Millisecond))
		t.Logf("operations: %s", formatCounts(stats.ops))
		t.Logf("events: %s", formatCounts(stats.events))
	}()
	if *modelSeed != 0 {
		runModel(t, rdb, *modelSeed, *modelRun, stats, conf)
	} else {
		for {
			left := total - time.Since(start)
			if left < time.Second {
				break
			}
			runModel(t, rdb, rand.Uint64()|1, min(*modelRun, left-700*time.Millisecond), stats, conf)
		}
	}
	return stats
}

func formatCounts(m map[string]int) string {
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(&b, "\n    %-58s %d", k, m[k])
	}
	return b.String()
}

func runModel(t *testing.T, rdb *redis.Client, seed uint64, d time.Duration, stats *modelStats, conf mConf) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	r := &mRun{t: t, ctx: context.Background(), rdb: rdb, seed: seed, rng: rng, stats: stats, knownFirst: map[string]string{},
		keys:  shard.Keys{Prefix: testenv.Name(t) + "-" + strconv.FormatUint(seed, 10), Queue: "q"},
		shift: conf.shift, byEstimate: conf.byEstimate, catch: conf.catch, name: conf.name}
	if r.shift != nil {
		r.shift.Set(t, 0) // each seed starts from the true clock
	}
	testenv.CleanRedis(t, rdb, r.keys.Prefix) // if the run fails
	for i := range 2 + rng.IntN(2) {
		r.shards = append(r.shards, &mShard{i: i, pending: map[string]*mSched{}, inflight: map[string]*mOcc{},
			attempts: map[string]int{}, dead: map[string]int64{}, reason: map[string]string{},
			leaked: map[string]bool{}, everConf: map[string]bool{}, deadlines: map[int64]*mBatch{},
			deadBody: map[string]any{}, deadProps: map[string]any{}})
	}
	// Ids named poison- or big- fail as plain members so named do, so that
	// ids are dead-lettered too.
	r.isID = map[string]bool{}
	for n, name := range []string{"id-1", "id-2", "id-3", "id:4", "poison-id-5", "big-id-6"} {
		if n < 4 || rng.IntN(2) == 0 {
			r.idNames = append(r.idNames, name)
			r.isID[name] = true
		}
	}
	for range 3 {
		r.spawn()
	}
	t.Logf("%s seed %d: %d shards, prefix %s", r.name, seed, len(r.shards), r.keys.Prefix)
	began := time.Now()
	stats.runStart = began
	steps0 := stats.steps
	r.check()
	for end := time.Now().Add(d); time.Now().Before(end); {
		r.step++
		r.doStep()
		r.check()
		r.endStep()
	}
	r.quiesce()
	stats.runs++
	stats.elapsed += time.Since(began)
	stats.runStart = time.Time{}
	t.Logf("%s seed %d: passed, %d steps in %v", r.name, seed, stats.steps-steps0, time.Since(began).Round(time.Millisecond))
	for _, ev := range sortedKeys(r.knownFirst) {
		t.Logf("%s seed %d: KNOWN FINDING tolerated (-model.strict fails on it): %s; first at %s", r.name, seed, ev, r.knownFirst[ev])
	}
	r.deleteKeys()
}

// ---- bookkeeping ----

func (r *mRun) note(format string, args ...any) {
	if r.cur.Len() > 0 {
		r.cur.WriteString("; ")
	}
	fmt.Fprintf(&r.cur, format, args...)
}

func (r *mRun) endStep() {
	r.log = append(r.log, fmt.Sprintf("%d: %s", r.step, r.cur.String()))
	if len(r.log) > mLogSteps {
		r.log = r.log[1:]
	}
	r.cur.Reset()
	r.stats.steps++
}

func (r *mRun) event(name string) { r.stats.events[name]++ }

// known counts a known finding (only the LEAK one: see the top of this
// file), which -model.strict fails on instead, and logs its first
// occurrence in the run.
func (r *mRun) known(event, format string, args ...any) {
	r.note("KNOWN FINDING tolerated: "+format, args...)
	r.event(event)
	if r.knownFirst[event] == "" {
		r.knownFirst[event] = fmt.Sprintf("step %d: %s", r.step, fmt.Sprintf(format, args...))
	}
}

func (r *mRun) fatalf(format string, args ...any) {
	r.t.Helper()
	msg := fmt.Sprintf("%s seed %d, step %d: %s\n  this step: %s\n  last steps:\n    %s\n  replay: go test ./scanner/ -run '%s$' -model.seed=%d",
		r.name, r.seed, r.step, fmt.Sprintf(format, args...), r.cur.String(), strings.Join(r.log, "\n    "), r.name, r.seed)
	if r.catch {
		panic(modelFailure(msg))
	}
	r.t.Fatal(msg)
}

func (r *mRun) nextID() int { r.ids++; return r.ids }

func (r *mRun) serverNow() int64 {
	tm, err := r.rdb.Time(r.ctx).Result()
	if err != nil {
		r.fatalf("TIME: %v", err)
	}
	return r.seen(tm.UnixMilli())
}

// seen notes a reading of the server clock, and returns it.
func (r *mRun) seen(now int64) int64 {
	r.hiNow = max(r.hiNow, now)
	return now
}

func (r *mRun) key(i, k int) string {
	switch k {
	case kPending:
		return r.keys.Pending(i)
	case kInflight:
		return r.keys.Inflight(i)
	case kAttempts:
		return r.keys.Attempts(i)
	case kDead:
		return r.keys.Dead(i)
	case kReason:
		return r.keys.DeadReason(i)
	}
	return r.keys.LastClaim(i)
}

func (r *mRun) stashKey(i, k int) string { return r.keys.Pending(i) + ":stash:" + kindNames[k] }

func (r *mRun) wantWrongType(err error, what string) {
	r.t.Helper()
	if !redis.HasErrorPrefix(err, "WRONGTYPE") {
		r.fatalf("%s with a wrong-type key: error %v, want WRONGTYPE", what, err)
	}
	r.note("WRONGTYPE as expected")
	r.event("wrongtype refused: " + what)
}

func (r *mRun) spawn() *mInst {
	n := len(r.insts) + 1
	lease := mLeases[r.rng.IntN(len(mLeases))]
	ahead := mAheads[r.rng.IntN(len(mAheads))]
	in := &mInst{name: "i" + strconv.Itoa(n), alive: true, readings: map[int]mReading{}}
	// As the scanner does: a claim ahead leases for the wait too.
	in.st = &store{rdb: r.rdb, keys: r.keys, lease: lease + ahead, ahead: ahead, retryMin: mRetryMin, retryMax: mRetryMax,
		maxAttempts: mMaxAttempts, instance: in.name}
	r.insts = append(r.insts, in)
	r.note("spawn %s lease %v look-ahead %v", in.name, lease, ahead)
	return in
}

func (r *mRun) alive() []*mInst {
	var out []*mInst
	for _, in := range r.insts {
		if in.alive {
			out = append(out, in)
		}
	}
	return out
}

func pick[T any](r *mRun, xs []T) T { return xs[r.rng.IntN(len(xs))] }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// ---- steps ----

type mOp struct {
	name   string
	weight int
	do     func() bool // false: not possible now
}

func (r *mRun) doStep() {
	ops := []mOp{
		{"produce new member", 12, r.opProduce},
		{"reschedule member", 5, r.opReschedule},
		{"schedule same due as in flight", 4, r.opSameDue},
		{"cancel", 4, r.opCancel},
		{"claim", 12, func() bool { return r.opClaim(false) }},
		{"claim, reply lost", 2, func() bool { return r.opClaim(true) }},
		{"claim run again", 4, r.opRerunClaim},
		{"peek", 1, r.opPeek},
		{"publish", 12, r.opPublish},
		{"settle", 15, r.opSettle},
		{"hand back what is held (stop)", 2, r.opHandBack},
		{"stop: unclaim what is held", 2, r.opUnclaim},
		{"schedule id", 8, r.opScheduleID},
		{"reschedule id (ZADD XX CH)", 4, r.opRescheduleID},
		{"cancel id", 3, r.opCancelID},
		{"ack stalled past the lease, the next holder dead-letters", 2, r.opLateAckOfDead},
		{"schedule id again at the due of its dead letter", 1, r.opScheduleIDAtDead},
		{"settle run again late", 3, r.opRerunSettle},
		{"sleep", 4, r.opSleep},
		{"instance dies", 1, r.opKill},
		{"instance starts", 2, r.opSpawn},
		{"wrong-type key appears", 2, r.opBreak},
		{"wrong-type key removed", 3, r.opRestore},
	}
	if r.shift != nil {
		ops = append(ops, mOp{"Redis clock steps", 3, r.opClockStep})
	}
	sum := 0
	for _, op := range ops {
		sum += op.weight
	}
	for {
		x := r.rng.IntN(sum)
		for _, op := range ops {
			if x -= op.weight; x < 0 {
				if op.do() {
					r.stats.ops[op.name]++
					return
				}
				break
			}
		}
	}
}

// opClockStep steps the Redis server's clock back (up to 500 ms) or
// forward (up to 400 ms), as an NTP step or a failover to a primary whose
// clock is off would; the shift stays within 2 s of the true clock.
func (r *mRun) opClockStep() bool {
	d := time.Duration(1+r.rng.IntN(400)) * time.Millisecond
	if r.rng.IntN(3) > 0 {
		d = -time.Duration(1+r.rng.IntN(500)) * time.Millisecond
	}
	next := r.shiftNow + d
	if next < -2*time.Second || next > 2*time.Second {
		d = -d
		next = r.shiftNow + d
	}
	before := r.serverNow()
	r.shift.Set(r.t, next)
	r.shiftNow = next
	after := r.serverNow()
	r.note("the Redis clock steps %v (now %v off): TIME read %d before, %d after", d, next, before, after)
	if d < 0 {
		r.event("Redis clock stepped back")
		if after < before {
			r.event("Redis clock stepped back, as TIME read it")
		}
	} else {
		r.event("Redis clock stepped forward")
	}
	return true
}

func (r *mRun) newMember() string {
	n := strconv.Itoa(len(r.members) + 1)
	var m string
	switch x := r.rng.IntN(100); {
	case x < 6:
		m = "big-" + n
	case x < 12:
		m = "poison-" + n
	case x < 16:
		m = pick(r, []string{"", "a:b:", "x y ", "\x00\xff", "{q:1}", "7:"}) + n
	default:
		m = "m" + n
	}
	r.members = append(r.members, m)
	return m
}

func (r *mRun) randomDue() int64 { return r.lastNow - 150 + int64(r.rng.IntN(450)) }

func (r *mRun) opProduce() bool {
	r.zadd(r.newMember(), r.randomDue(), "new")
	return true
}

func (r *mRun) opReschedule() bool {
	if len(r.members) == 0 {
		return false
	}
	m := pick(r, r.members)
	due := r.randomDue()
	if s := r.shards[shard.Index([]byte(m), len(r.shards))].pending[m]; s != nil && s.due == due {
		due++
	}
	r.zadd(m, due, "again, another due")
	return true
}

func (r *mRun) allOccs() []*mOcc {
	var out []*mOcc
	for _, sh := range r.shards {
		for _, e := range sortedKeys(sh.inflight) {
			out = append(out, sh.inflight[e])
		}
	}
	return out
}

func (r *mRun) opSameDue() bool {
	occs := r.allOccs()
	if len(occs) == 0 {
		return false
	}
	o := pick(r, occs)
	if r.isID[o.member] {
		return r.scheduleID(o.member, o.due, "again, a new body at the due of its in-flight entry")
	}
	r.zadd(o.member, o.due, "again, the due of its in-flight entry")
	return true
}

// zadd is a producer's ZADD.
func (r *mRun) zadd(member string, due int64, why string) {
	i := shard.Index([]byte(member), len(r.shards))
	sh := r.shards[i]
	r.note("producer ZADD %q due %d on shard %d (%s)", member, due, i, why)
	err := r.rdb.ZAdd(r.ctx, r.keys.Pending(i), redis.Z{Score: float64(due), Member: member}).Err()
	if sh.wrong[kPending] != nil {
		r.wantWrongType(err, "producer ZADD")
		return
	}
	if err != nil {
		r.fatalf("ZADD: %v", err)
	}
	if old := sh.pending[member]; old != nil {
		if old.due == due {
			r.note("already pending at that due: unchanged")
			return
		}
		old.state = sSuperseded
		r.event("pending scheduling replaced by a ZADD")
	}
	if _, ok := sh.inflight[EntryOf([]byte(member), due)]; ok {
		r.event("ZADD of an in-flight entry's member and due")
	}
	s := &mSched{id: r.nextID(), shard: i, member: member, due: due, state: sPending, step: r.step}
	sh.pending[member] = s
	r.scheds = append(r.scheds, s)
	r.active = append(r.active, s)
}

func (r *mRun) opCancel() bool {
	type cand struct {
		i int
		m string
	}
	var pend, claimed []cand
	for _, sh := range r.shards {
		// Ids are cancelled as the contract says (opCancelID).
		for _, m := range sortedKeys(sh.pending) {
			if !r.isID[m] {
				pend = append(pend, cand{sh.i, m})
			}
		}
		for _, e := range sortedKeys(sh.inflight) {
			if m := sh.inflight[e].member; sh.pending[m] == nil && !r.isID[m] {
				claimed = append(claimed, cand{sh.i, m})
			}
		}
	}
	var c cand
	switch {
	case len(pend) > 0 && (len(claimed) == 0 || r.rng.IntN(4) > 0):
		c = pick(r, pend)
	case len(claimed) > 0:
		c = pick(r, claimed)
	default:
		return false
	}
	sh := r.shards[c.i]
	r.note("producer ZREM %q on shard %d", c.m, c.i)
	n, err := r.rdb.ZRem(r.ctx, r.keys.Pending(c.i), c.m).Result()
	if sh.wrong[kPending] != nil {
		r.wantWrongType(err, "producer ZREM")
		return true
	}
	if err != nil {
		r.fatalf("ZREM: %v", err)
	}
	var want int64
	if s := sh.pending[c.m]; s != nil {
		want = 1
		s.state = sCancelled
		delete(sh.pending, c.m)
	} else {
		r.event("cancel of a claimed member: no effect")
	}
	if n != want {
		r.fatalf("ZREM %q removed %d, want %d", c.m, n, want)
	}
	return true
}

// ---- tasks with an id: the producer's side as the contract says ----

func (r *mRun) idShard(id string) (int, *mShard) {
	i := shard.Index([]byte(id), len(r.shards))
	return i, r.shards[i]
}

func (r *mRun) opScheduleID() bool {
	return r.scheduleID(pick(r, r.idNames), r.randomDue(), "new body")
}

// opScheduleIDAtDead schedules an id again with the due time of its dead
// letter: the same entry, and so the same claimed fields (the known
// finding below).
func (r *mRun) opScheduleIDAtDead() bool {
	type cand struct {
		id  string
		due int64
	}
	var cs []cand
	for _, sh := range r.shards {
		for _, e := range sortedKeys(sh.dead) {
			if task, err := ParseEntry(e); err == nil && r.isID[string(task.Member)] {
				cs = append(cs, cand{string(task.Member), task.DueMs})
			}
		}
	}
	if len(cs) == 0 {
		return false
	}
	c := pick(r, cs)
	return r.scheduleID(c.id, c.due, "again, at the due of its dead letter")
}

// scheduleID is a producer's schedule of an id: MULTI, HSET :tasks, HSET
// (or HDEL) :props, ZADD, EXEC. Scheduling a pending id replaces its
// body, properties and due time: a new scheduling.
func (r *mRun) scheduleID(id string, due int64, why string) bool {
	i, sh := r.idShard(id)
	if sh.wrong[kPending] != nil {
		// MULTI does not undo the HSETs when the ZADD fails: a producer's
		// problem, not the dispatcher's; not done here.
		return false
	}
	if _, dead := sh.dead[EntryOf([]byte(id), due)]; dead && sh.anyWrong(kDead, kReason) {
		return false // see pendingAtDead
	}
	s := &mSched{id: r.nextID(), shard: i, member: id, due: due, state: sPending, step: r.step}
	body := "body of s" + strconv.Itoa(s.id)
	if r.rng.IntN(10) == 0 {
		body = "" // an empty body is a body
	}
	s.body = body
	props := ""
	if r.rng.IntN(2) == 0 {
		props = `{"type":"s` + strconv.Itoa(s.id) + `"}`
		s.props = props
	}
	r.note("producer schedules id %q due %d on shard %d body %q props %q (%s)", id, due, i, body, props, why)
	_, err := r.rdb.TxPipelined(r.ctx, func(p redis.Pipeliner) error {
		p.HSet(r.ctx, r.keys.Tasks(i), id, body)
		if props != "" {
			p.HSet(r.ctx, r.keys.Props(i), id, props)
		} else {
			p.HDel(r.ctx, r.keys.Props(i), id)
		}
		p.ZAdd(r.ctx, r.keys.Pending(i), redis.Z{Score: float64(due), Member: id})
		return nil
	})
	if err != nil {
		r.fatalf("schedule of id %q: %v", id, err)
	}
	if old := sh.pending[id]; old != nil {
		old.state = sSuperseded
		r.event("id: pending scheduling replaced by a schedule (new body)")
	} else if len(r.occsOf(sh, id)) > 0 {
		r.event("id: scheduled again while claimed")
	}
	if _, ok := sh.inflight[EntryOf([]byte(id), due)]; ok {
		r.event("id: scheduled again at the due of its in-flight entry")
	}
	if _, ok := sh.dead[EntryOf([]byte(id), due)]; ok {
		r.event("id: scheduled again at the due of its dead letter")
	}
	sh.pending[id] = s
	r.scheds = append(r.scheds, s)
	r.active = append(r.active, s)
	return true
}

func (r *mRun) occsOf(sh *mShard, member string) []*mOcc {
	var out []*mOcc
	for _, e := range sortedKeys(sh.inflight) {
		if o := sh.inflight[e]; o.member == member {
			out = append(out, o)
		}
	}
	return out
}

// opRescheduleID is a producer's reschedule: ZADD XX CH, which moves only
// a pending id (body and properties unchanged), and finds a claimed or
// held one gone.
func (r *mRun) opRescheduleID() bool {
	id := pick(r, r.idNames)
	i, sh := r.idShard(id)
	due := r.randomDue()
	r.note("producer reschedules id %q to %d on shard %d (ZADD XX CH)", id, due, i)
	n, err := r.rdb.ZAddArgs(r.ctx, r.keys.Pending(i), redis.ZAddArgs{XX: true, Ch: true,
		Members: []redis.Z{{Score: float64(due), Member: id}}}).Result()
	if sh.wrong[kPending] != nil {
		r.wantWrongType(err, "producer ZADD XX CH")
		return true
	}
	if err != nil {
		r.fatalf("ZADD XX CH: %v", err)
	}
	var want int64
	switch old := sh.pending[id]; {
	case old == nil:
		if len(r.occsOf(sh, id)) > 0 {
			r.event("id: reschedule of a claimed id: no effect")
		}
	case old.due == due:
	default:
		want = 1
		old.state = sSuperseded
		s := &mSched{id: r.nextID(), shard: i, member: id, due: due, state: sPending, step: r.step, body: old.body, props: old.props}
		sh.pending[id] = s
		r.scheds = append(r.scheds, s)
		r.active = append(r.active, s)
		r.event("id: rescheduled while pending")
	}
	if n != want {
		r.fatalf("ZADD XX CH of id %q changed %d, want %d", id, n, want)
	}
	return true
}

// opCancelID is a producer's cancel: MULTI, ZREM, HDEL :tasks, HDEL
// :props, EXEC; cancelled if the ZREM removed it.
func (r *mRun) opCancelID() bool {
	id := pick(r, r.idNames)
	i, sh := r.idShard(id)
	if sh.wrong[kPending] != nil {
		return false // MULTI would HDEL the body of an id it cannot ZREM: see scheduleID
	}
	r.note("producer cancels id %q on shard %d", id, i)
	var zrem *redis.IntCmd
	_, err := r.rdb.TxPipelined(r.ctx, func(p redis.Pipeliner) error {
		zrem = p.ZRem(r.ctx, r.keys.Pending(i), id)
		p.HDel(r.ctx, r.keys.Tasks(i), id)
		p.HDel(r.ctx, r.keys.Props(i), id)
		return nil
	})
	if err != nil {
		r.fatalf("cancel of id %q: %v", id, err)
	}
	var want int64
	if s := sh.pending[id]; s != nil {
		want = 1
		s.state = sCancelled
		delete(sh.pending, id)
		r.event("id: cancelled while pending")
	} else if len(r.occsOf(sh, id)) > 0 {
		r.event("id: cancel while in flight: no effect")
	}
	if zrem.Val() != want {
		r.fatalf("cancel of id %q removed %d, want %d", id, zrem.Val(), want)
	}
	return true
}

func (r *mRun) opClaim(lost bool) bool {
	in := pick(r, r.alive())
	i := r.rng.IntN(len(r.shards))
	limit := 1 + r.rng.IntN(4)
	token := in.st.token()
	sent := time.Now()
	b, now := r.doClaim(in, i, limit, token, nil)
	if !lost {
		r.claimRead(in, i, b, now, sent)
		return true
	}
	r.note("reply lost")
	in.lostClaims = append(in.lostClaims, &mLostClaim{shard: i, limit: limit, token: token, first: b})
	switch x := r.rng.IntN(8); {
	case x < 4:
		r.rerunClaim(in, len(in.lostClaims)-1)
	case x == 4 && b != nil && b.deadline-b.now <= 130:
		// The retry comes after the lease ran out: the :claim record is
		// still this claim's, so it gets its batch back, expired.
		d := time.Duration(b.deadline-b.now+2) * time.Millisecond
		r.note("sleep %v, past the lease deadline", d)
		time.Sleep(d)
		r.rerunClaim(in, len(in.lostClaims)-1)
	}
	return true
}

func (r *mRun) opRerunClaim() bool {
	var ins []*mInst
	for _, in := range r.alive() {
		if len(in.lostClaims) > 0 {
			ins = append(ins, in)
		}
	}
	if len(ins) == 0 {
		return false
	}
	in := pick(r, ins)
	r.rerunClaim(in, r.rng.IntN(len(in.lostClaims)))
	return true
}

func (r *mRun) rerunClaim(in *mInst, k int) {
	lc := in.lostClaims[k]
	in.lostClaims = slices.Delete(in.lostClaims, k, k+1)
	r.note("%s runs claim %s again (go-redis retry after the lost reply)", in.name, lc.token)
	sent := time.Now()
	b, now := r.doClaim(in, lc.shard, lc.limit, lc.token, lc)
	r.claimRead(in, lc.shard, b, now, sent)
}

// claimRead is what an instance does with a claim's reply (now 0: the
// claim failed): it holds the batch, and, as dispatch does, publishes at
// once the tasks the claim's own reading of the Redis clock shows due
// (those claimed ahead stay held, whatever the instance's estimate); the
// reading, taken after the instance's other tasks of the shard were held,
// also confirms those it shows due (clockCheck.note).
func (r *mRun) claimRead(in *mInst, i int, b *mBatch, now int64, sent time.Time) {
	if now == 0 {
		return
	}
	in.observe(i, now, sent)
	if b != nil {
		in.batches = append(in.batches, b)
		// Half the time the instance is slow to dispatch: a publish step
		// comes later, with a reading of its own.
		if r.rng.IntN(2) == 0 {
			r.note("%s dispatches %s at once by the claim's reading %d", in.name, b, now)
			r.publishDue(b, now, "at once, due by the claim's own reading")
		}
	}
	if r.rng.IntN(2) > 0 {
		return
	}
	for _, x := range in.batches {
		if x == b || x.shard != i {
			continue
		}
		for idx, o := range x.occs {
			if x.outcome[idx] == "" && mustDue(r, o.entry) <= now {
				r.note("%s publishes what %s holds, confirmed due by the claim's reading %d", in.name, x, now)
				r.publishDue(x, now, "held, confirmed due by a later claim's reading")
				break
			}
		}
	}
}

// doClaim runs a claim as in and checks its answer against the model,
// which it then updates. rerun is the lost claim it runs again, if any.
// It returns the batch (nil if it handed out nothing) and the claim's
// reading of the server clock (0 if a wrong-type key refused it).
func (r *mRun) doClaim(in *mInst, i, limit int, token string, rerun *mLostClaim) (*mBatch, int64) {
	sh := r.shards[i]
	r.note("%s claim shard %d limit %d token %s", in.name, i, limit, token)
	c, err := in.st.claimAs(r.ctx, i, limit, token)
	if sh.anyWrong(kPending, kInflight, kAttempts, kClaim) {
		r.wantWrongType(err, "claim")
		return nil, 0
	}
	if err != nil {
		r.fatalf("claim: %v", err)
	}
	r.note("-> now %d deadline %d reaped %d entries %q", c.now, c.deadline, c.reaped, c.entries)
	// The clock may have stepped back since the highest time read: an
	// entry re-leased now was first claimed when it read as late as that.
	back := max(0, r.hiNow-c.now)
	r.seen(c.now)
	if back > 0 {
		r.event("claim: the Redis clock reads behind a time read before")
	}
	for _, e := range c.entries {
		task, err := ParseEntry(e)
		if err != nil {
			r.fatalf("claim handed out %q: %v", e, err)
		}
		// A pending task is claimed within the claim's look-ahead; an
		// entry re-leased (handed back, or its lease ran out) within the
		// look-ahead of the claim that took it first, at a server time at
		// most the highest read so far: either way the holder keeps it
		// until due.
		horizon := in.st.ahead
		if _, was := r.shards[i].inflight[e]; was {
			horizon = slices.Max(mAheads) + time.Duration(back)*time.Millisecond
		}
		if task.DueMs > c.now+horizon.Milliseconds() {
			r.fatalf("EARLY: claim handed out %q, due %d, beyond server time %d + look-ahead %v", e, task.DueMs, c.now, horizon)
		}
		if task.DueMs > c.now {
			r.event("claimed ahead of its due time")
		}
	}
	var b *mBatch
	if l := sh.claimOf(token); rerun != nil && l != nil {
		// The shard's :claim record holds this claim: the script returns
		// what it still holds, at any time, and claims nothing.
		if c.deadline != l.deadline {
			r.fatalf("claim run again with token %s, in the shard's :claim record with deadline %d, returned deadline %d",
				token, l.deadline, c.deadline)
		}
		if l != sh.lastClaim() {
			r.event("claim run again after later claims of its shard")
		}
		b = r.claimAgain(sh, c, rerun)
	} else {
		if rerun != nil {
			r.event("claim run again: its token no longer in the :claim record, claimed anew")
		}
		b = r.claimFresh(in, sh, c, limit, token)
	}
	r.checkNext(sh, c)
	return b, c.now
}

// claimAgain checks a claim run again with the token of the shard's
// :claim record: it must return exactly the entries that claim still
// holds, however late.
func (r *mRun) claimAgain(sh *mShard, c claimed, lc *mLostClaim) *mBatch {
	first := lc.first
	if first == nil {
		r.fatalf("claim run again returned deadline %d of a claim that claimed nothing", c.deadline)
	}
	if c.now < first.deadline {
		r.event("claim run again: same batch, within its lease")
	} else {
		r.event("claim run again: same batch, after its lease deadline")
	}
	var want []string
	for _, e := range sortedKeys(sh.inflight) {
		if sh.inflight[e].holder == first {
			want = append(want, e)
		}
	}
	if !slices.Equal(want, c.entries) {
		what := ""
		for _, e := range c.entries {
			if !slices.Contains(want, e) {
				what = "COLLISION: "
			}
		}
		r.fatalf("%sclaim run again with token %s returned %q, want the entries its first run still holds %q%s",
			what, lc.token, c.entries, want, r.fenceDiag(sh, first, c.entries))
	}
	if len(want) < len(first.entries) {
		r.event("claim run again: same batch, some entries gone")
	}
	first.entries, first.occs, first.outcome, first.settled = nil, nil, nil, nil
	for _, e := range c.entries {
		first.add(sh.inflight[e])
	}
	r.checkBodies(sh, "claim run again", c, first.occs)
	if len(first.entries) == 0 {
		return nil
	}
	return first
}

// holds says whether a fail or release by b acts on o: only while b is
// the claim that last handed o out and it has not let go of it since. The
// scripts compare o's lease with b's deadline; the test fails where the
// two differ (an entry whose lease is the deadline of a batch that does
// not hold it).
func (r *mRun) holds(sh *mShard, b *mBatch, o *mOcc, what string) bool {
	spec := o != nil && o.holder == b
	script := o != nil && o.lease == b.deadline && !o.half
	if spec != script {
		r.fatalf("COLLISION: %s by %s acts on %s, which it does not hold (it lost it: %s)%s",
			what, b, o, cmp.Or(b.lost[o], "never held"), r.fenceDiag(sh, b, []string{o.entry}))
	}
	return spec
}

// fenceDiag explains entries whose lease is batch b's deadline although b
// does not hold them: the scripts cannot tell b from their holder.
func (r *mRun) fenceDiag(sh *mShard, b *mBatch, entries []string) string {
	var out strings.Builder
	for _, e := range entries {
		if o := sh.inflight[e]; o != nil && o.lease == b.deadline && !o.half && o.holder != b {
			fmt.Fprintf(&out, "\n  FENCING: entry %s has the lease deadline %d of %s, which does not hold it "+
				"(lost by %s: %q); its lease was set by %s.",
				o, b.deadline, b, b, cmp.Or(b.lost[o], "never held"), o.leaseBy)
		}
	}
	return out.String()
}

func (r *mRun) predictClaim(sh *mShard, now, ahead int64, limit int) ([]*mOcc, []*mSched) {
	var occs []*mOcc
	for _, o := range sh.inflight {
		if o.expired(now) {
			occs = append(occs, o)
		}
	}
	slices.SortFunc(occs, func(a, b *mOcc) int {
		return cmp.Or(cmp.Compare(a.score2(), b.score2()), strings.Compare(a.entry, b.entry))
	})
	occs = occs[:min(len(occs), limit)]
	var due []*mSched
	for _, s := range sh.pending {
		if s.due <= now+ahead {
			due = append(due, s)
		}
	}
	slices.SortFunc(due, func(a, b *mSched) int {
		return cmp.Or(cmp.Compare(a.due, b.due), strings.Compare(a.member, b.member))
	})
	return occs, due[:min(len(due), limit-len(occs))]
}

func (r *mRun) claimFresh(in *mInst, sh *mShard, c claimed, limit int, token string) *mBatch {
	lease := in.st.lease.Milliseconds()
	want := c.now + lease
	last := "none"
	if l := sh.lastClaim(); l != nil {
		last = strconv.FormatInt(l.deadline, 10)
		if l.deadline+1 > want {
			want = l.deadline + 1
			r.event("claim deadline: the shard's last deadline + 1, above now + lease")
		}
	}
	if c.deadline != want {
		r.fatalf("claim deadline %d, want max(now %d + lease %d, :claim record's deadline %s + 1) = %d",
			c.deadline, c.now, lease, last, want)
	}
	expired, due := r.predictClaim(sh, c.now, in.st.ahead.Milliseconds(), limit)
	var wantE []string
	reaped := 0
	for _, o := range expired {
		wantE = append(wantE, o.entry)
		if _, counted := sh.attempts[o.entry]; o.lease > 0 && !counted {
			reaped++
		}
	}
	for _, s := range due {
		// A due member whose entry is already in flight merges into it.
		if e := EntryOf([]byte(s.member), s.due); sh.inflight[e] == nil {
			wantE = append(wantE, e)
		}
	}
	if !slices.Equal(wantE, c.entries) {
		var diag strings.Builder
		for _, e := range c.entries {
			if o := sh.inflight[e]; o != nil && !o.expired(c.now) && !slices.Contains(wantE, e) {
				fmt.Fprintf(&diag, "\n  LIVE LEASE TAKEN: %s handed out at %d", o, c.now)
			}
		}
		for _, e := range wantE {
			if !slices.Contains(c.entries, e) {
				fmt.Fprintf(&diag, "\n  not handed out although due or expired: %q", e)
			}
		}
		seen := map[string]bool{}
		for _, e := range c.entries {
			if seen[e] {
				fmt.Fprintf(&diag, "\n  handed out twice: %q", e)
			}
			seen[e] = true
		}
		r.fatalf("claim at %d handed out %q, want %q%s", c.now, c.entries, wantE, diag.String())
	}
	if c.reaped != reaped {
		r.fatalf("claim reaped count %d, want %d", c.reaped, reaped)
	}
	fields := withFields(sh)
	b := &mBatch{id: r.nextID(), inst: in, shard: sh.i, token: token, now: c.now, deadline: c.deadline,
		lost: map[*mOcc]string{}, claimStep: r.step, shift: r.shiftNow.Milliseconds()}
	for _, o := range expired {
		switch h := o.holder; {
		case h != nil:
			// Leases are in server time: a clock stepped forward since
			// the holder's claim ends them before that much real time
			// passed (and one stepped back extends them).
			how := "expired"
			if c.now-b.shift < h.deadline-h.shift {
				how = "expired by the Redis clock stepped forward"
			}
			h.lost[o] = how
			r.event("claim took over an expired lease")
			if how != "expired" {
				r.event("claim took over a lease that expired only by the clock stepped forward")
			}
		case o.lease == 0:
			r.event("claim took a released entry")
		default:
			r.event("claim took an entry whose backoff ran out")
		}
		o.lease, o.half, o.holder = b.deadline, false, b
		o.leaseBy = fmt.Sprintf("the claim of %s (re-leased)", b)
		b.add(o)
	}
	for _, s := range due {
		delete(sh.pending, s.member)
		e := EntryOf([]byte(s.member), s.due)
		o := sh.inflight[e]
		switch {
		case o == nil:
			o = &mOcc{id: r.nextID(), entry: e, member: s.member, due: s.due, body: s.body, props: s.props}
			sh.inflight[e] = o
			r.claimedWhileDead(sh, o, fields)
			o.lease, o.half, o.holder = b.deadline, false, b
			o.leaseBy = fmt.Sprintf("the claim of %s", b)
			b.add(o)
			r.event("claim took a due pending task")
		case o.holder == b:
			r.event("due pending task merged into the entry the same claim re-leased (handed out once)")
		case o.holder != nil:
			r.event("due pending task merged into its in-flight entry (its live holder keeps it)")
		default:
			r.event("due pending task merged into its in-flight entry (waiting for a retry)")
		}
		o.group = append(o.group, s)
		s.state, s.occ = sInflight, o
	}
	r.checkBodies(sh, "claim", c, b.occs)
	if len(b.entries) == 0 {
		return nil
	}
	if x := sh.deadlines[b.deadline]; x != nil {
		r.fatalf("COLLISION: %s has the lease deadline of %s", b, x)
	}
	sh.deadlines[b.deadline] = b
	sh.claims = append(sh.claims, mLastClaim{token: token, deadline: b.deadline})
	if len(sh.claims) > claimRecords {
		sh.claims = slices.Delete(sh.claims, 0, len(sh.claims)-claimRecords)
	}
	return b
}

// checkBodies checks the body and properties a claim returned with each
// entry (occs, in its order): those the producer wrote for the scheduling
// that the entry's first claim took, never a later or earlier one's.
func (r *mRun) checkBodies(sh *mShard, what string, c claimed, occs []*mOcc) {
	if len(c.bodies) != len(c.entries) || len(c.props) != len(c.entries) {
		r.fatalf("%s returned %d entries, %d bodies, %d properties", what, len(c.entries), len(c.bodies), len(c.props))
	}
	for idx, o := range occs {
		if c.bodies[idx] != o.body || c.props[idx] != o.props {
			r.fatalf("BODY: %s returned %q with body %s and properties %s, want %s and %s (those of %s)",
				what, o.entry, quoteAny(c.bodies[idx]), quoteAny(c.props[idx]), quoteAny(o.body), quoteAny(o.props), o.group[0])
		}
		if o.body != nil {
			r.event("id: claim returned its body")
		}
	}
}

// quoteAny is a body or properties as a claim returns them: a string, or
// nil for none.
func quoteAny(v any) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprintf("%q", v)
}

// claimedWhileDead: an entry claimed afresh while an entry of the same
// id and due is dead-lettered (the producer scheduled the id again at that
// due time: the same message_id) supersedes the dead letter, whose claimed
// body and properties would otherwise be the new entry's too. The claim
// script looks only where claimed fields exist at all (withFields: some
// pending or claimed task of the shard had a body or properties when the
// claim began); without any, the dead letter has none to share and stays.
func (r *mRun) claimedWhileDead(sh *mShard, o *mOcc, withFields bool) {
	if _, dead := sh.dead[o.entry]; !dead || !withFields {
		return
	}
	if sh.anyWrong(kDead, kReason) {
		r.event("claim of an entry dead-lettered under a wrong-type dead-letter key (left)")
		return
	}
	delete(sh.dead, o.entry)
	delete(sh.reason, o.entry)
	delete(sh.deadBody, o.entry)
	delete(sh.deadProps, o.entry)
	for _, x := range r.scheds {
		if x.state == sDead && x.shard == sh.i && EntryOf([]byte(x.member), x.due) == o.entry {
			x.state = sSuperseded
		}
	}
	r.event("claim of an entry superseded its dead letter")
}

// withFields reports whether any task of the shard has a body or
// properties stored: pending, in flight or dead.
func withFields(sh *mShard) bool {
	for _, s := range sh.pending {
		if s.body != nil || s.props != nil {
			return true
		}
	}
	for _, o := range sh.inflight {
		if o.body != nil || o.props != nil {
			return true
		}
	}
	return len(sh.deadBody) > 0 || len(sh.deadProps) > 0
}

// checkNext checks the claim's report of when the shard next needs a claim.
func (r *mRun) checkNext(sh *mShard, c claimed) {
	var wantP, wantL []int64
	for _, s := range sh.pending {
		wantP = append(wantP, s.due)
	}
	for _, o := range sh.inflight {
		l := o.lease
		if o.half {
			l++ // parseScore rounds up: the first whole ms it is due
		}
		wantL = append(wantL, l)
	}
	for _, x := range []struct {
		name string
		got  any
		want []int64
	}{{"next pending", c.nextPending, wantP}, {"next lease", c.nextLease, wantL}} {
		got, ok := parseScore(x.got)
		switch {
		case len(x.want) == 0 && ok:
			r.fatalf("claim reports %s %v, want none", x.name, x.got)
		case len(x.want) > 0 && (!ok || got != slices.Min(x.want)):
			r.fatalf("claim reports %s %v, want %d", x.name, x.got, slices.Min(x.want))
		}
	}
}

func (r *mRun) opPeek() bool {
	in := pick(r, r.alive())
	i := r.rng.IntN(len(r.shards))
	sh := r.shards[i]
	r.note("%s peeks at shard %d (claim limit 0)", in.name, i)
	c, err := in.st.claim(r.ctx, i, 0)
	if sh.anyWrong(kPending, kInflight) {
		r.wantWrongType(err, "peek")
		return true
	}
	if err != nil {
		r.fatalf("peek: %v", err)
	}
	if len(c.entries) != 0 || c.deadline != 0 || c.reaped != 0 {
		r.fatalf("peek claimed: %+v", c)
	}
	r.checkNext(sh, c)
	return true
}

// outcome is what publishing member once gives.
func (r *mRun) outcome(member string) string {
	switch {
	case strings.HasPrefix(member, "big-"):
		return "oversize"
	case strings.HasPrefix(member, "poison-") && r.rng.IntN(10) < 8:
		return "refused"
	case r.isID[member] && r.rng.IntN(10) == 0:
		// Its deadline_ms passed: dead-lettered at once by this publisher,
		// where an earlier holder may have published it in time.
		return "deadline"
	}
	x := r.rng.IntN(100)
	for _, o := range []struct {
		upTo int
		name string
	}{{50, "confirm"}, {57, "nack"}, {63, "returned"}, {70, "timeout"}, {74, "channel"}, {77, "refused"},
		{89, "lost"}, {95, "not_connected"}, {100, "stopped"}} {
		if x < o.upTo {
			return o.name
		}
	}
	return "confirm"
}

// settleKind is what dispatch does after a publish outcome.
func settleKind(outcome string) string {
	switch outcome {
	case "confirm":
		return "ack"
	case "nack", "returned", "timeout", "channel", "refused", "oversize", "deadline":
		return "fail"
	}
	return "release"
}

func (r *mRun) knownBatches(want func(b *mBatch) bool) []*mBatch {
	var out []*mBatch
	for _, in := range r.alive() {
		for _, b := range in.batches {
			if want(b) {
				out = append(out, b)
			}
		}
	}
	return out
}

// opLateAckOfDead: an instance whose publish of an id was confirmed
// stalls past its lease before its ack; another instance takes the entry
// over and dead-letters it (its deadline_ms passed by then); then the
// stalled ack comes. The dead letter keeps its body and properties.
func (r *mRun) opLateAckOfDead() bool {
	now := r.serverNow()
	type cand struct {
		b   *mBatch
		idx int
	}
	var cs []cand
	for _, b := range r.knownBatches(func(*mBatch) bool { return true }) {
		for idx, o := range b.occs {
			if b.outcome[idx] == "confirm" && !b.settled[idx] && o.holder == b && o.body != nil &&
				b.deadline-now <= 200 && r.shards[b.shard].wrong[kInflight] == nil {
				cs = append(cs, cand{b, idx})
			}
		}
	}
	if len(cs) == 0 {
		return false
	}
	c := pick(r, cs)
	b, o := c.b, c.b.occs[c.idx]
	var others []*mInst
	for _, in := range r.alive() {
		if in != b.inst {
			others = append(others, in)
		}
	}
	if len(others) == 0 {
		return false
	}
	d := time.Duration(b.deadline-now+2) * time.Millisecond
	r.note("%s stalls %v before acking %q, past its lease", b.inst.name, d, o.entry)
	time.Sleep(d)
	in := pick(r, others)
	sent := time.Now()
	b2, at := r.doClaim(in, b.shard, 50, in.st.token(), nil)
	r.claimRead(in, b.shard, b2, at, sent)
	if b2 != nil && o.holder == b2 {
		idx := slices.Index(b2.occs, o)
		if b2.outcome[idx] == "" {
			b2.outcome[idx] = "deadline"
			r.note("%s: %q dead-lettered, its deadline passed", in.name, o.entry)
			if r.settle(b2, "fail", []int{idx}) {
				b2.settled[idx] = true
				r.event("id: dead-lettered by the holder after a stalled one")
			}
		}
	}
	if r.settle(b, "ack", []int{c.idx}) {
		b.settled[c.idx] = true
	}
	return true
}

// opUnclaim is an instance stopping as dispatch does: what a batch holds
// and never published goes back into pending (unclaimScript), its body
// and properties back under the id; what cannot go back (its member is
// pending again, or it failed before) is released, its claimed body kept.
func (r *mRun) opUnclaim() bool {
	bs := r.knownBatches(func(b *mBatch) bool { return slices.Contains(b.outcome, "") })
	if len(bs) == 0 {
		return false
	}
	b := pick(r, bs)
	sh := r.shards[b.shard]
	var idxs []int
	var entries []string
	for idx := range b.occs {
		if b.outcome[idx] == "" {
			idxs = append(idxs, idx)
			entries = append(entries, b.entries[idx])
		}
	}
	r.note("%s stops: unclaims what %s holds %q", b.inst.name, b, entries)
	back, released, err := b.inst.st.unclaim(r.ctx, b.shard, b.deadline, entries)
	if sh.anyWrong(kPending, kInflight, kAttempts) {
		r.wantWrongType(err, "unclaim")
		return true
	}
	if err != nil {
		r.fatalf("unclaim: %v", err)
	}
	wantB, wantR := 0, 0
	for _, idx := range idxs {
		b.outcome[idx], b.settled[idx] = "unclaimed", true
		e := b.entries[idx]
		o := sh.inflight[e]
		if !r.holds(sh, b, o, "unclaim") {
			continue
		}
		b.lost[o] = "unclaimed"
		if _, failed := sh.attempts[e]; failed || sh.pending[o.member] != nil {
			wantR++
			o.lease, o.half, o.holder = 0, false, nil
			o.leaseBy = fmt.Sprintf("the unclaim of %s (step %d), released", b, r.step)
			if failed {
				r.event("unclaim: failed before, released")
			} else {
				r.event("unclaim: member pending again, released")
				if o.body != nil {
					r.event("unclaim: id pending again, released with its claimed body")
				}
			}
			continue
		}
		wantB++
		delete(sh.inflight, e)
		o.holder = nil
		// Back into pending as the scheduling the first claim took; those
		// merged into it are the same message_id, which it carries on.
		s := o.group[0]
		s.state, s.occ = sPending, nil
		sh.pending[o.member] = s
		for _, x := range o.group[1:] {
			x.state = sSuperseded
			r.event("unclaim: a merged scheduling goes on as the one put back")
		}
		r.event("unclaim: back into pending")
		if o.body != nil {
			r.event("unclaim: id back into pending with its body")
		}
	}
	if back != wantB || released != wantR {
		r.fatalf("unclaim put back %d and released %d, want %d and %d%s", back, released, wantB, wantR, r.fenceDiag(sh, b, entries))
	}
	if !slices.Contains(b.settled, false) {
		b.inst.batches = slices.DeleteFunc(b.inst.batches, func(x *mBatch) bool { return x == b })
	}
	return true
}

// opHandBack is an instance stopping: what it holds, claimed ahead and
// not due yet, is given back (released) at once rather than left to its
// lease.
func (r *mRun) opHandBack() bool {
	at := r.serverNow()
	bs := r.knownBatches(func(b *mBatch) bool {
		for idx, o := range b.occs {
			if b.outcome[idx] == "" && mustDue(r, o.entry) > at {
				return true
			}
		}
		return false
	})
	if len(bs) == 0 {
		return false
	}
	b := pick(r, bs)
	r.note("%s stops: hands back what %s holds", b.inst.name, b)
	for idx, o := range b.occs {
		if b.outcome[idx] == "" && mustDue(r, o.entry) > at {
			b.outcome[idx] = "stopped"
			r.event("held entry handed back")
		}
	}
	return true
}

// mustDue is the due time of an in-flight entry.
func mustDue(r *mRun, entry string) int64 {
	t, err := ParseEntry(entry)
	if err != nil {
		r.fatalf("entry %q: %v", entry, err)
	}
	return t.DueMs
}

// opPublish: an instance publishes what a batch holds that is due. As the
// holder does (clockCheck), a held task goes out only once a reading of
// the Redis clock taken after it was held shows it due: the instance
// sends TIME (every task the batch holds was held at its claim, an
// earlier step). With byEstimate it goes by its estimate instead: its
// last reading of the shard's clock plus the time passed since, which a
// clock stepped back since that reading makes early.
func (r *mRun) opPublish() bool {
	bs := r.knownBatches(func(b *mBatch) bool { return slices.Contains(b.outcome, "") })
	if len(bs) == 0 {
		return false
	}
	b := pick(r, bs)
	in := b.inst
	if rd, ok := in.readings[b.shard]; ok && r.byEstimate {
		at := rd.server + time.Since(rd.sent).Milliseconds()
		r.note("%s publishes %s by its estimate %d of the Redis clock (its reading %d, %v ago)", in.name, b, at, rd.server, time.Since(rd.sent).Round(time.Millisecond))
		r.publishDue(b, at, "held, due by the instance's estimate")
		return true
	}
	sent := time.Now()
	at := r.serverNow()
	in.observe(b.shard, at, sent)
	r.note("%s publishes %s by a reading %d taken after it was held", in.name, b, at)
	r.publishDue(b, at, "held, confirmed due by a TIME read after holding")
	return true
}

// publishDue publishes the tasks b holds that are due at server time at,
// as the instance's reading (or estimate) says, and checks that none is
// early by the server clock as read at the publish: a TIME read right
// after (no step of the clock comes between).
func (r *mRun) publishDue(b *mBatch, at int64, how string) {
	var sent []*mOcc
	for idx, o := range b.occs {
		if b.outcome[idx] != "" {
			continue
		}
		if due := mustDue(r, o.entry); due > at {
			r.event("held: not due at publish time")
			continue
		}
		sent = append(sent, o)
		out := r.outcome(o.member)
		b.outcome[idx] = out
		r.note("%q: %s", o.entry, out)
		r.event("publish outcome " + out)
		r.event("published " + how)
		if out != "confirm" {
			continue
		}
		for _, x := range o.confirms {
			r.checkDuplicate(b, x, o)
		}
		o.confirms = append(o.confirms, b)
		r.shards[b.shard].everConf[o.entry] = true
	}
	if len(sent) == 0 {
		return
	}
	now := r.serverNow()
	for _, o := range sent {
		if o.due > now {
			r.fatalf("EARLY: %s published %q, due %d, at server time %d (by %d ms; decided %s, at %d)",
				b.inst.name, o.entry, o.due, now, o.due-now, how, at)
		}
	}
}

// checkDuplicate allows b's confirmed publish of o after x's only from the
// at-least-once window: the earlier of the two batches lost its lease to
// expiry.
func (r *mRun) checkDuplicate(b, x *mBatch, o *mOcc) {
	if x == b {
		r.fatalf("DUPLICATE: %q confirmed twice by %s (%q): one batch listed one entry twice", o.entry, b, b.entries)
	}
	first := x
	if b.id < x.id {
		first = b
	}
	switch how := first.lost[o]; {
	case strings.HasPrefix(how, "expired") && !first.inst.alive:
		r.event("duplicate: lease ran out, its instance died (" + how + ")")
	case strings.HasPrefix(how, "expired"):
		r.event("duplicate: lease ran out, its instance stalled or acked late (" + how + ")")
	default:
		r.fatalf("DUPLICATE outside the at-least-once window: %q confirmed by %s and by %s, but %s never lost its lease to expiry (%q)%s",
			o.entry, x, b, first, cmp.Or(how, "still holds it"), r.fenceDiag(r.shards[first.shard], first, []string{o.entry}))
	}
}

func (r *mRun) opSettle() bool {
	bs := r.knownBatches(func(b *mBatch) bool {
		for idx := range b.outcome {
			if b.outcome[idx] != "" && !b.settled[idx] {
				return true
			}
		}
		return false
	})
	if len(bs) == 0 {
		return false
	}
	b := pick(r, bs)
	groups := map[string][]int{}
	for idx := range b.outcome {
		if b.outcome[idx] != "" && !b.settled[idx] {
			k := settleKind(b.outcome[idx])
			groups[k] = append(groups[k], idx)
		}
	}
	kind := pick(r, sortedKeys(groups))
	idxs := groups[kind]
	if kind == "ack" && r.rng.IntN(3) == 0 && r.ackTogether(b, idxs) {
		return true
	}
	if !r.settle(b, kind, idxs) {
		return true // a wrong-type key refused it; the instance tries again later
	}
	for _, idx := range idxs {
		b.settled[idx] = true
	}
	switch x := r.rng.IntN(100); {
	case x < 12:
		r.note("reply lost, run again at once")
		r.settle(b, kind, idxs)
	case x < 20:
		r.note("reply lost, to run again later")
		b.inst.reruns = append(b.inst.reruns, mRerun{b, kind, idxs})
	}
	if !slices.Contains(b.settled, false) {
		b.inst.batches = slices.DeleteFunc(b.inst.batches, func(x *mBatch) bool { return x == b })
	}
	return true
}

func (r *mRun) opRerunSettle() bool {
	var ins []*mInst
	for _, in := range r.alive() {
		if len(in.reruns) > 0 {
			ins = append(ins, in)
		}
	}
	if len(ins) == 0 {
		return false
	}
	in := pick(r, ins)
	k := r.rng.IntN(len(in.reruns))
	x := in.reruns[k]
	in.reruns = slices.Delete(in.reruns, k, k+1)
	r.note("%s runs its %s again (lost reply, retried late)", in.name, x.kind)
	r.settle(x.b, x.kind, x.idxs)
	return true
}

// settle runs one of b's settle calls; false if a wrong-type key refused it.
func (r *mRun) settle(b *mBatch, kind string, idxs []int) bool {
	sh := r.shards[b.shard]
	var entries []string
	for _, idx := range idxs {
		entries = append(entries, b.entries[idx])
	}
	stale := false
	for _, idx := range idxs {
		if b.occs[idx].holder != b {
			stale = true
		}
	}
	if stale {
		r.event("settle " + kind + " by a batch that no longer holds some of its entries")
	}
	r.note("%s %s %s %q", b.inst.name, kind, b, entries)
	switch kind {
	case "ack":
		return r.doAck(sh, b, idxs, entries)
	case "release":
		return r.doRelease(sh, b, entries)
	}
	return r.doFail(sh, b, idxs)
}

// endOcc removes o from the in-flight set of the model.
func (r *mRun) endOcc(sh *mShard, o *mOcc, to schedState) {
	delete(sh.inflight, o.entry)
	if _, ok := sh.attempts[o.entry]; ok {
		if sh.wrong[kAttempts] == nil {
			delete(sh.attempts, o.entry)
			delete(sh.leaked, o.entry)
		} else {
			if *modelStrict {
				r.fatalf("LEAK (known finding, fatal with -model.strict): ack of %q cannot delete its attempts field: the attempts hash is moved away (it comes back with it)", o.entry)
			}
			sh.leaked[o.entry] = true
			r.known("LEAK: attempts field left behind by an ack while the attempts hash was moved away",
				"attempts field %q stays: the attempts hash is moved away", o.entry)
		}
	}
	if o.holder != nil {
		o.holder.lost[o] = "ended"
		o.holder = nil
	}
	for _, s := range o.group {
		s.state = to
	}
	if to == sDead {
		for _, f := range []struct {
			m map[string]any
			v any
		}{{sh.deadBody, o.body}, {sh.deadProps, o.props}} {
			if f.v != nil {
				f.m[o.entry] = f.v
			} else {
				delete(f.m, o.entry)
			}
		}
	}
}

// pendingAcks is what b has confirmed and not yet acked.
func pendingAcks(b *mBatch) []int {
	var idxs []int
	for idx := range b.outcome {
		if b.outcome[idx] != "" && !b.settled[idx] && settleKind(b.outcome[idx]) == "ack" {
			idxs = append(idxs, idx)
		}
	}
	return idxs
}

// ackTogether acks b's idxs and the pending acks of b's instance's batches
// of other shards in one call, as an instance's flush does on one server;
// false if b's instance has no such batch.
func (r *mRun) ackTogether(b *mBatch, idxs []int) bool {
	batches, sets := []*mBatch{b}, [][]int{idxs}
	seen := map[int]bool{b.shard: true}
	for _, o := range b.inst.batches {
		if pend := pendingAcks(o); !seen[o.shard] && len(pend) > 0 {
			seen[o.shard] = true
			batches, sets = append(batches, o), append(sets, pend)
		}
	}
	if len(batches) == 1 {
		return false
	}
	shards, entries := make([]int, len(batches)), make([][]string, len(batches))
	for n, x := range batches {
		shards[n] = x.shard
		for _, idx := range sets[n] {
			entries[n] = append(entries[n], x.entries[idx])
		}
		r.note("%s ack %s %q (one call for %d shards)", x.inst.name, x, entries[n], len(batches))
	}
	ns, errs, err := b.inst.st.ackShards(r.ctx, shards, entries)
	if err != nil {
		r.fatalf("ack of %d shards: %v", len(shards), err)
	}
	r.event("ack of several shards in one call")
	for n, x := range batches {
		if !r.checkAck(r.shards[x.shard], x, sets[n], entries[n], ns[n], errs[n]) {
			continue
		}
		for _, idx := range sets[n] {
			x.settled[idx] = true
		}
		if !slices.Contains(x.settled, false) {
			x.inst.batches = slices.DeleteFunc(x.inst.batches, func(y *mBatch) bool { return y == x })
		}
	}
	return true
}

func (r *mRun) doAck(sh *mShard, b *mBatch, idxs []int, entries []string) bool {
	n, err := b.inst.st.ack(r.ctx, b.shard, entries)
	return r.checkAck(sh, b, idxs, entries, n, err)
}

// checkAck holds the model to an ack's outcome on shard sh: n removed, or err.
func (r *mRun) checkAck(sh *mShard, b *mBatch, idxs []int, entries []string, n int, err error) bool {
	if sh.wrong[kInflight] != nil {
		r.wantWrongType(err, "ack")
		return false
	}
	if err != nil {
		r.fatalf("ack: %v", err)
	}
	want := 0
	for _, idx := range idxs {
		o := sh.inflight[b.entries[idx]]
		if o == nil {
			if _, dead := sh.dead[b.entries[idx]]; dead {
				r.event("ack of an entry dead-lettered meanwhile")
				if _, ok := sh.deadBody[b.entries[idx]]; ok {
					r.event("ack of an entry dead-lettered meanwhile, with a body (kept)")
				}
			}
			continue
		}
		want++
		if o != b.occs[idx] {
			r.event("ack removed a later stay of the same entry (same message_id)")
			if len(o.confirms) == 0 {
				r.event("ack removed a later stay of the same entry never published since")
			}
		} else if o.holder != b {
			r.event("ack by a batch that no longer holds the lease")
		}
		r.endOcc(sh, o, sConfirmed)
	}
	if sh.wrong[kAttempts] == nil { // the ack deletes the fields of all its entries, in flight or not
		for _, e := range entries {
			if sh.leaked[e] {
				r.event("ack deleted an attempts field an earlier ack had left")
			}
			delete(sh.attempts, e)
			delete(sh.leaked, e)
		}
	}
	if n != want {
		r.fatalf("ack removed %d entries, want %d", n, want)
	}
	return true
}

func (r *mRun) doRelease(sh *mShard, b *mBatch, entries []string) bool {
	n, err := b.inst.st.release(r.ctx, b.shard, b.deadline, entries)
	if sh.wrong[kInflight] != nil {
		r.wantWrongType(err, "release")
		return false
	}
	if err != nil {
		r.fatalf("release: %v", err)
	}
	want := 0
	for _, e := range entries {
		o := sh.inflight[e]
		if !r.holds(sh, b, o, "release") {
			continue
		}
		want++
		o.lease, o.half, o.holder = 0, false, nil
		o.leaseBy = fmt.Sprintf("the release of %s (step %d)", b, r.step)
		b.lost[o] = "released"
	}
	if n != want {
		r.fatalf("release handed back %d entries, want %d%s", n, want, r.fenceDiag(sh, b, entries))
	}
	return true
}

func (r *mRun) doFail(sh *mShard, b *mBatch, idxs []int) bool {
	var fails []outcome
	for _, idx := range idxs {
		switch out := b.outcome[idx]; out {
		case "refused":
			fails = append(fails, outcome{b.entries[idx], "poison", "refused"})
		case "oversize":
			fails = append(fails, outcome{b.entries[idx], "dead", "oversize"})
		case "deadline":
			fails = append(fails, outcome{b.entries[idx], "dead", "deadline passed"})
		default:
			fails = append(fails, outcome{b.entries[idx], "retry", out})
		}
	}
	t0 := r.serverNow()
	retried, dead, err := b.inst.st.fail(r.ctx, b.shard, b.deadline, fails)
	if sh.anyWrong(kInflight, kAttempts, kDead, kReason) {
		r.wantWrongType(err, "fail")
		return false
	}
	if err != nil {
		r.fatalf("fail: %v", err)
	}
	pipe := r.rdb.Pipeline()
	t1c := pipe.Time(r.ctx)
	scores := map[string]*redis.FloatCmd{}
	for _, f := range fails {
		scores[f.entry] = pipe.ZScore(r.ctx, r.keys.Inflight(b.shard), f.entry)
	}
	_, _ = pipe.Exec(r.ctx)
	t1 := t1c.Val().UnixMilli()
	wantR, wantD := 0, 0
	for _, f := range fails {
		o := sh.inflight[f.entry]
		if !r.holds(sh, b, o, "fail") {
			continue
		}
		n := sh.attempts[f.entry] + 1
		sh.attempts[f.entry] = n
		if f.mode == "dead" || (f.mode == "poison" && n >= mMaxAttempts) {
			wantD++
			sh.dead[f.entry] = o.due
			sh.reason[f.entry] = fmt.Sprintf("%s (after %d attempts)", f.reason, n)
			b.lost[o] = "failed"
			o.holder = nil
			r.endOcc(sh, o, sDead)
			r.event("dead-lettered (" + f.mode + ")")
			continue
		}
		wantR++
		backoff := min(mRetryMin.Milliseconds()<<min(n-1, 30), mRetryMax.Milliseconds())
		s, err := scores[f.entry].Result()
		if err != nil {
			r.fatalf("retried entry %q not in flight after fail: %v", f.entry, err)
		}
		got := int64(math.Floor(s))
		if s-float64(got) != 0.5 {
			r.fatalf("retry of %q: lease %v, want a whole ms and a half (never a claim's deadline)", f.entry, s)
		}
		if got < t0+backoff-1 || got > t1+backoff {
			r.fatalf("retry %d of %q: lease %d, want the server time (%d..%d) + backoff %d", n, f.entry, got, t0, t1, backoff)
		}
		o.lease, o.half, o.holder = got, true, nil
		o.leaseBy = fmt.Sprintf("the retry backoff %d ms of %s's fail at server time %d..%d (step %d)", backoff, b, t0, t1, r.step)
		b.lost[o] = "failed"
	}
	if retried != wantR || dead != wantD {
		var entries []string
		for _, f := range fails {
			entries = append(entries, f.entry)
		}
		r.fatalf("fail retried %d and dead-lettered %d, want %d and %d%s", retried, dead, wantR, wantD, r.fenceDiag(sh, b, entries))
	}
	return true
}

func (r *mRun) opSleep() bool {
	d := time.Duration(1+r.rng.IntN(5)) * time.Millisecond
	if r.rng.IntN(12) == 0 {
		d = time.Duration(20+r.rng.IntN(100)) * time.Millisecond
	}
	r.note("sleep %v", d)
	time.Sleep(d)
	return true
}

func (r *mRun) opKill() bool {
	al := r.alive()
	if len(al) < 2 {
		return false
	}
	in := pick(r, al)
	in.alive = false
	in.batches, in.lostClaims, in.reruns = nil, nil, nil
	r.note("%s dies, forgetting what it held", in.name)
	r.event("instance died")
	return true
}

func (r *mRun) opSpawn() bool {
	if len(r.alive()) >= 4 {
		return false
	}
	r.spawn()
	return true
}

func (r *mRun) modelEmpty(sh *mShard, k int) bool {
	switch k {
	case kPending:
		return len(sh.pending) == 0
	case kInflight:
		return len(sh.inflight) == 0
	case kAttempts:
		return len(sh.attempts) == 0
	case kDead:
		return len(sh.dead) == 0
	case kReason:
		return len(sh.reason) == 0
	}
	return len(sh.claims) == 0
}

// pendingAtDead reports whether a pending scheduling has the entry of a
// dead letter. Its claim supersedes the dead letter, which the claim
// cannot do while the dead-letter set or reasons are of the wrong type:
// then the two would share their claimed fields (a known limit, for an
// operator's wrong-type key and a producer's same-due schedule at once),
// which the model does not generate.
func (r *mRun) pendingAtDead(sh *mShard) bool {
	for _, s := range sh.pending {
		if _, dead := sh.dead[EntryOf([]byte(s.member), s.due)]; dead {
			return true
		}
	}
	return false
}

// opBreak makes a key of a shard the wrong type: over an absent key, or
// after renaming the real one away, to put it back exactly later.
func (r *mRun) opBreak() bool {
	i, k := r.rng.IntN(len(r.shards)), r.rng.IntN(nKinds)
	sh := r.shards[i]
	if sh.wrong[k] != nil || (k == kDead || k == kReason) && r.pendingAtDead(sh) {
		return false
	}
	key := r.key(i, k)
	w := &mWrong{moved: !r.modelEmpty(sh, k)}
	r.note("shard %d: %s key made the wrong type (real data moved away: %v)", i, kindNames[k], w.moved)
	if w.moved {
		// The :claim record no longer expires: every key the model holds
		// something in is there.
		if err := r.rdb.Rename(r.ctx, key, r.stashKey(i, k)).Err(); err != nil {
			r.fatalf("RENAME %s: %v", key, err)
		}
	}
	var err error
	if k == kClaim {
		err = r.rdb.RPush(r.ctx, key, "someone's list").Err()
	} else {
		err = r.rdb.SetNX(r.ctx, key, "someone's string", 0).Err()
	}
	if err != nil {
		r.fatalf("making %s the wrong type: %v", key, err)
	}
	sh.wrong[k] = w
	r.event("wrong-type " + kindNames[k] + " key")
	return true
}

func (r *mRun) opRestore() bool {
	type cand struct{ i, k int }
	var cs []cand
	for _, sh := range r.shards {
		for k := range nKinds {
			if sh.wrong[k] != nil {
				cs = append(cs, cand{sh.i, k})
			}
		}
	}
	if len(cs) == 0 {
		return false
	}
	c := pick(r, cs)
	r.restore(c.i, c.k)
	return true
}

func (r *mRun) restore(i, k int) {
	sh := r.shards[i]
	key := r.key(i, k)
	r.note("shard %d: wrong-type %s key removed", i, kindNames[k])
	if err := r.rdb.Del(r.ctx, key).Err(); err != nil {
		r.fatalf("DEL %s: %v", key, err)
	}
	if sh.wrong[k].moved {
		if err := r.rdb.Rename(r.ctx, r.stashKey(i, k), key).Err(); err != nil {
			r.fatalf("RENAME back to %s: %v", key, err)
		}
	}
	sh.wrong[k] = nil
}

// ---- checking ----

type snapShard struct {
	z      [nKinds]map[string]int64
	h      [nKinds]map[string]string
	claim  string
	hasCl  bool
	claimK string // the key the :claim record was read from
}

// check reads every key of the queue and compares it with the model.
func (r *mRun) check() {
	pipe := r.rdb.Pipeline()
	t0c := pipe.Time(r.ctx)
	type cmds struct {
		z     [nKinds]*redis.ZSliceCmd
		h     [nKinds]*redis.MapStringStringCmd
		claim *redis.StringCmd
		typ   [nKinds]*redis.StatusCmd
		// The retrying index is not modelled: it is checked against the
		// attempts hash as read, which the model checks.
		retrying *redis.ZSliceCmd
		// :tasks, :props, claimed:body, claimed:props
		ids [4]*redis.MapStringStringCmd
	}
	all := make([]cmds, len(r.shards))
	for i, sh := range r.shards {
		all[i].retrying = pipe.ZRangeWithScores(r.ctx, r.keys.Retrying(i), 0, -1)
		for n, key := range r.idKeys(i) {
			all[i].ids[n] = pipe.HGetAll(r.ctx, key)
		}
		for k := range nKinds {
			key := r.key(i, k)
			if w := sh.wrong[k]; w != nil {
				all[i].typ[k] = pipe.Type(r.ctx, key)
				if !w.moved {
					continue
				}
				key = r.stashKey(i, k)
			}
			switch k {
			case kPending, kInflight, kDead:
				all[i].z[k] = pipe.ZRangeWithScores(r.ctx, key, 0, -1)
			case kAttempts, kReason:
				all[i].h[k] = pipe.HGetAll(r.ctx, key)
			case kClaim:
				all[i].claim = pipe.Get(r.ctx, key)
			}
		}
	}
	t1c := pipe.Time(r.ctx)
	_, _ = pipe.Exec(r.ctx)
	if err := cmp.Or(t0c.Err(), t1c.Err()); err != nil {
		r.fatalf("reading the keys: %v", err)
	}
	t0, t1 := t0c.Val().UnixMilli(), t1c.Val().UnixMilli()
	r.lastNow = r.seen(t1)
	var diffs []string
	for i, sh := range r.shards {
		c := all[i]
		var got snapShard
		for k := range nKinds {
			if c.typ[k] != nil {
				want := "string"
				if k == kClaim {
					want = "list"
				}
				if typ := c.typ[k].Val(); typ != want {
					diffs = append(diffs, fmt.Sprintf("shard %d: wrong-type %s key is a %q (%v), want %s", i, kindNames[k], typ, c.typ[k].Err(), want))
				}
			}
			switch {
			case c.z[k] != nil:
				zs, err := c.z[k].Result()
				if err != nil {
					r.fatalf("reading shard %d %s: %v", i, kindNames[k], err)
				}
				got.z[k] = map[string]int64{}
				for _, z := range zs {
					score := z.Score
					if k == kInflight {
						score *= 2 // a retry's lease ends in half a ms
					}
					got.z[k][z.Member.(string)] = int64(score)
					if float64(int64(score)) != score {
						diffs = append(diffs, fmt.Sprintf("shard %d %s: %q has a fractional score %v", i, kindNames[k], z.Member, z.Score))
					}
				}
			case c.h[k] != nil:
				m, err := c.h[k].Result()
				if err != nil {
					r.fatalf("reading shard %d %s: %v", i, kindNames[k], err)
				}
				got.h[k] = m
			case k == kClaim && c.claim != nil:
				v, err := c.claim.Result()
				if err != nil && err != redis.Nil {
					r.fatalf("reading shard %d claim: %v", i, err)
				}
				got.claim, got.hasCl = v, err == nil
			}
		}
		diffs = append(diffs, r.compareShard(sh, &got, t0, t1)...)
		diffs = append(diffs, r.compareIDs(sh, &got, c.ids)...)
		diffs = append(diffs, retryingAgrees(i, c.retrying, got.h[kAttempts])...)
	}
	if len(diffs) > 0 {
		r.fatalf("Redis differs from the model:\n  %s", strings.Join(diffs, "\n  "))
	}
	r.checkSchedulings()
	if r.step%250 == 0 {
		r.checkKeyNames()
	}
}

func (r *mRun) idKeys(i int) [4]string {
	return [4]string{r.keys.Tasks(i), r.keys.Props(i), r.keys.ClaimedBody(i), r.keys.ClaimedProps(i)}
}

// compareIDs checks the hashes of tasks with an id against the model: a
// pending member's body and properties are under it in :tasks and :props
// exactly when its scheduling wrote them; an in-flight or dead entry's
// are under it in claimed:body and claimed:props exactly when the
// scheduling its first claim took had them. And, from the keys as read
// alone: no :tasks or :props field of a member not pending, no claimed
// field of an entry neither in flight nor dead.
func (r *mRun) compareIDs(sh *mShard, got *snapShard, cmds [4]*redis.MapStringStringCmd) []string {
	var h [4]map[string]string
	for n, c := range cmds {
		m, err := c.Result()
		if err != nil {
			r.fatalf("reading shard %d %s: %v", sh.i, r.idKeys(sh.i)[n], err)
		}
		h[n] = m
	}
	want := [4]map[string]string{{}, {}, {}, {}}
	put := func(m map[string]string, k string, v any) {
		if v != nil {
			m[k] = v.(string)
		}
	}
	for m, s := range sh.pending {
		put(want[0], m, s.body)
		put(want[1], m, s.props)
	}
	for e, o := range sh.inflight {
		put(want[2], e, o.body)
		put(want[3], e, o.props)
	}
	for e := range sh.dead {
		put(want[2], e, sh.deadBody[e])
		put(want[3], e, sh.deadProps[e])
	}
	var out []string
	names := [4]string{"tasks", "props", "claimed:body", "claimed:props"}
	for n := range 4 {
		out = append(out, diffMaps(fmt.Sprintf("shard %d %s", sh.i, names[n]), want[n], h[n])...)
	}
	for n := range 2 {
		for m := range h[n] {
			if _, ok := got.z[kPending][m]; !ok {
				out = append(out, fmt.Sprintf("LEAK: shard %d %s field %q: its member is not pending", sh.i, names[n], m))
			}
		}
	}
	for n := 2; n < 4; n++ {
		for e := range h[n] {
			_, in := got.z[kInflight][e]
			_, dead := got.z[kDead][e]
			if !in && !dead {
				out = append(out, fmt.Sprintf("LEAK: shard %d %s field %q: its entry is neither in flight nor dead", sh.i, names[n], e))
			}
		}
	}
	return out
}

func diffMaps[V comparable](what string, want, got map[string]V) []string {
	var out []string
	for _, k := range sortedKeys(want) {
		if g, ok := got[k]; !ok {
			out = append(out, fmt.Sprintf("%s: %q missing (want %v)", what, k, want[k]))
		} else if g != want[k] {
			out = append(out, fmt.Sprintf("%s: %q is %v, want %v", what, k, g, want[k]))
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%s: %q (%v) unexpected", what, k, got[k]))
		}
	}
	if len(out) > 12 {
		out = append(out[:12], fmt.Sprintf("%s: ... %d differences in all", what, len(out)))
	}
	return out
}

func (r *mRun) compareShard(sh *mShard, got *snapShard, t0, t1 int64) []string {
	var out []string
	name := func(k int) string { return fmt.Sprintf("shard %d %s", sh.i, kindNames[k]) }
	wantZ := [nKinds]map[string]int64{kPending: {}, kInflight: {}, kDead: {}}
	for m, s := range sh.pending {
		wantZ[kPending][m] = s.due
	}
	for e, o := range sh.inflight {
		wantZ[kInflight][e] = o.score2() // the snapshot holds twice the in-flight scores
	}
	for e, d := range sh.dead {
		wantZ[kDead][e] = d
	}
	wantH := [nKinds]map[string]string{kAttempts: {}, kReason: {}}
	for e, n := range sh.attempts {
		wantH[kAttempts][e] = strconv.Itoa(n)
	}
	for e, s := range sh.reason {
		wantH[kReason][e] = s
	}
	for _, k := range []int{kPending, kInflight, kDead} {
		if got.z[k] == nil { // a wrong-type key over an absent one: the model must hold nothing
			got.z[k] = map[string]int64{}
		}
		out = append(out, diffMaps(name(k), wantZ[k], got.z[k])...)
	}
	for _, k := range []int{kAttempts, kReason} {
		if got.h[k] == nil {
			got.h[k] = map[string]string{}
		}
		out = append(out, diffMaps(name(k), wantH[k], got.h[k])...)
	}
	// The :claim record never expires: exactly the last claimRecords claims
	// that handed something out, newest last, whatever the time.
	switch want := sh.record(); {
	case want == "" && got.hasCl:
		out = append(out, fmt.Sprintf("%s: %q, want none", name(kClaim), got.claim))
	case want != "" && !got.hasCl:
		out = append(out, fmt.Sprintf("%s: gone at %d..%d, want %q", name(kClaim), t0, t1, want))
	case want != "" && got.claim != want:
		out = append(out, fmt.Sprintf("%s: %q, want %q", name(kClaim), got.claim, want))
	}
	// The model's own consistency: a holder's lease is its deadline, and
	// no two claims of the shard share a deadline.
	for _, e := range sortedKeys(sh.inflight) {
		if o := sh.inflight[e]; o.holder != nil && o.lease != o.holder.deadline {
			out = append(out, fmt.Sprintf("model: %s held with lease %d, not its holder's deadline", o, o.lease))
		}
	}
	// Independent of the model's bookkeeping: the shard's own keys agree.
	for e := range got.h[kAttempts] {
		if _, ok := got.z[kInflight][e]; !ok && !sh.leaked[e] {
			out = append(out, fmt.Sprintf("LEAK: %s field %q belongs to no in-flight entry", name(kAttempts), e))
		}
	}
	for e := range got.h[kReason] {
		if _, ok := got.z[kDead][e]; !ok {
			out = append(out, fmt.Sprintf("LEAK: %s field %q belongs to no dead entry", name(kReason), e))
		}
	}
	for e := range got.z[kDead] {
		if _, ok := got.h[kReason][e]; !ok {
			out = append(out, fmt.Sprintf("%s: dead entry %q has no reason", name(kDead), e))
		}
	}
	return out
}

// checkSchedulings checks that every scheduling not yet settled is where
// the model says (a more direct message than a differing key).
func (r *mRun) checkSchedulings() {
	keep := r.active[:0]
	for _, s := range r.active {
		sh := r.shards[s.shard]
		switch s.state {
		case sPending:
			if sh.pending[s.member] != s {
				r.fatalf("LOST: %s is not the pending scheduling of its member", s)
			}
		case sInflight:
			if sh.inflight[s.occ.entry] != s.occ || !slices.Contains(s.occ.group, s) {
				r.fatalf("LOST: %s is not in flight as %q", s, s.occ.entry)
			}
		case sConfirmed:
			if !sh.everConf[EntryOf([]byte(s.member), s.due)] {
				r.fatalf("LOST: %s left the in-flight set by an ack, but no publish of its entry was confirmed", s)
			}
			if len(s.occ.confirms) == 0 {
				r.event("scheduling removed by an ack of an earlier publish of its entry (same message_id)")
			}
			continue
		case sDead:
			if _, ok := sh.dead[EntryOf([]byte(s.member), s.due)]; !ok {
				r.fatalf("LOST: %s was dead-lettered but its entry is not in the dead set", s)
			}
			continue
		default:
			continue
		}
		keep = append(keep, s)
	}
	clear(r.active[len(keep):])
	r.active = keep
}

// retryingAgrees checks a shard's retrying index against its attempts
// hash (as read, from its stash while moved away): the fail script writes
// both, and the ack and dead-lettering remove both, so they hold the same
// entries, each scored by its due time.
func retryingAgrees(i int, retrying *redis.ZSliceCmd, attempts map[string]string) []string {
	zs, err := retrying.Result()
	if err != nil {
		return []string{fmt.Sprintf("shard %d retrying: %v", i, err)}
	}
	var out []string
	in := map[string]bool{}
	for _, z := range zs {
		e := z.Member.(string)
		in[e] = true
		if task, err := ParseEntry(e); err != nil || float64(task.DueMs) != z.Score {
			out = append(out, fmt.Sprintf("shard %d retrying: %q scored %v, not its due time", i, e, z.Score))
		}
		if _, ok := attempts[e]; !ok {
			out = append(out, fmt.Sprintf("shard %d retrying: %q has no attempts field", i, e))
		}
	}
	for e := range attempts {
		if !in[e] {
			out = append(out, fmt.Sprintf("shard %d retrying: %q, with an attempts field, is missing", i, e))
		}
	}
	return out
}

// checkKeyNames checks that the queue has no keys but its shards' six,
// the retrying index, and the stash keys of wrong-type keys moved away.
func (r *mRun) checkKeyNames() {
	allowed := map[string]bool{}
	for _, sh := range r.shards {
		allowed[r.keys.Retrying(sh.i)] = true
		for _, key := range r.idKeys(sh.i) {
			allowed[key] = true
		}
		for k := range nKinds {
			allowed[r.key(sh.i, k)] = true
			if w := sh.wrong[k]; w != nil && w.moved {
				allowed[r.stashKey(sh.i, k)] = true
			}
		}
	}
	iter := r.rdb.Scan(r.ctx, 0, r.keys.Prefix+":*", 1000).Iterator()
	for iter.Next(r.ctx) {
		if !allowed[iter.Val()] {
			r.fatalf("unexpected key %q", iter.Val())
		}
	}
	if err := iter.Err(); err != nil {
		r.fatalf("SCAN: %v", err)
	}
}

// quiesce ends a run: wrong-type keys restored, every instance dead, one
// new instance claims and settles until nothing is pending or in flight.
func (r *mRun) quiesce() {
	r.step++
	r.note("quiesce: restore wrong-type keys, every instance dies")
	for _, sh := range r.shards {
		for k := range nKinds {
			if sh.wrong[k] != nil {
				r.restore(sh.i, k)
			}
		}
	}
	for _, in := range r.alive() {
		in.alive = false
		in.batches, in.lostClaims, in.reruns = nil, nil, nil
	}
	final := r.spawn()
	final.st.lease, final.st.ahead = 5*time.Second, 0 // publishes what it claims at once
	r.check()
	r.endStep()
	// A lease set before the clock stepped back lasts that much longer.
	behind := time.Duration(max(0, r.hiNow-r.serverNow())) * time.Millisecond
	for end := time.Now().Add(5*time.Second + behind); ; {
		empty := true
		for _, sh := range r.shards {
			if len(sh.pending) > 0 || len(sh.inflight) > 0 {
				empty = false
			}
		}
		if empty {
			break
		}
		if time.Now().After(end) {
			r.fatalf("quiesce: still pending or in flight after %v", 5*time.Second+behind)
		}
		r.step++
		r.note("quiesce")
		for i := range r.shards {
			b, _ := r.doClaim(final, i, 50, final.st.token(), nil)
			if b == nil {
				continue
			}
			idxs := map[string][]int{}
			for idx, o := range b.occs {
				out := "confirm"
				if strings.HasPrefix(o.member, "big-") {
					out = "oversize"
				}
				b.outcome[idx] = out
				if out == "confirm" {
					for _, x := range o.confirms {
						r.checkDuplicate(b, x, o)
					}
					o.confirms = append(o.confirms, b)
					r.shards[i].everConf[o.entry] = true
				}
				idxs[settleKind(out)] = append(idxs[settleKind(out)], idx)
			}
			for _, kind := range sortedKeys(idxs) {
				if !r.settle(b, kind, idxs[kind]) {
					r.fatalf("quiesce: %s refused", kind)
				}
			}
		}
		r.check()
		r.endStep()
		time.Sleep(5 * time.Millisecond)
	}
	for _, s := range r.scheds {
		if s.state == sPending || s.state == sInflight {
			r.fatalf("LOST after quiescing: %s", s)
		}
		r.event("scheduling ended " + stateNames[s.state])
	}
	for _, sh := range r.shards {
		for e := range sh.attempts {
			if !sh.leaked[e] {
				r.fatalf("after quiescing, attempts field %q left on shard %d", e, sh.i)
			}
		}
	}
	r.checkKeyNames()
}

func (r *mRun) deleteKeys() {
	iter := r.rdb.Scan(r.ctx, 0, r.keys.Prefix+":*", 1000).Iterator()
	var ks []string
	for iter.Next(r.ctx) {
		ks = append(ks, iter.Val())
	}
	if len(ks) > 0 {
		r.rdb.Del(r.ctx, ks...)
	}
}
