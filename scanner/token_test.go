package scanner

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// The audit's finding 1 (issue 20): a claim that ran in Redis but whose
// answer was lost keeps its token, so the next claim returns that batch at
// once rather than after the lease. An error answer to the re-run (or a
// "paused" answer, given before the script compares tokens) means the
// re-run did not run: the token must survive it. Each case failed before
// the fix: the next claim took a fresh token and the 5 tasks waited out
// their 30 s lease.
func TestLostClaimTokenSurvivesErrorAnswers(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	for _, c := range []struct {
		name          string
		break_, mend_ func(t *testing.T, s *Scanner)
	}{
		{"paused", func(t *testing.T, s *Scanner) {
			rdb.Set(ctx, s.keys.Paused(0), "1", 0)
		}, func(t *testing.T, s *Scanner) {
			rdb.Del(ctx, s.keys.Paused(0))
		}},
		{"wrongtype", func(t *testing.T, s *Scanner) {
			rdb.Set(ctx, s.keys.Attempts(0), "not a hash", 0)
		}, func(t *testing.T, s *Scanner) {
			rdb.Del(ctx, s.keys.Attempts(0))
		}},
		{"noperm", nil, nil}, // an ACL user briefly without EVALSHA: set up below
	} {
		t.Run(c.name, func(t *testing.T) {
			client := rdb
			if c.name == "noperm" {
				user := testenv.Name(t)
				acl := func(rules ...any) {
					args := append([]any{"ACL", "SETUSER", user}, rules...)
					if err := rdb.Do(ctx, args...).Err(); err != nil {
						t.Fatal(err)
					}
				}
				acl("reset", "on", ">pw", "~*", "&*", "+@all")
				t.Cleanup(func() { rdb.Do(ctx, "ACL", "DELUSER", user) })
				opt := *rdb.Options()
				opt.Username, opt.Password = user, "pw"
				client = redis.NewClient(&opt)
				t.Cleanup(func() { client.Close() })
				c.break_ = func(*testing.T, *Scanner) { acl("-evalsha") }
				c.mend_ = func(*testing.T, *Scanner) { acl("+evalsha") }
			}
			s := tokenScanner(t, client)
			s.prim.unanswered = map[int]string{}
			due := scheduleDue(t, rdb, s, 5)

			// The claim runs in Redis; its answer is lost on the way back.
			j := s.prim.jobs(ctx, []int{0}, 10, 1)[0]
			if d := s.runClaims(ctx, j); d.errs[0] != nil || len(d.vals[0]) != 5+3*5 {
				t.Fatalf("first claim: %v %v", d.errs[0], d.vals[0])
			}
			s.absorb(claimDone{job: j, vals: make([][]any, 1), errs: []error{errors.New("i/o timeout")},
				before: make([]time.Time, 1), after: make([]time.Time, 1)})

			// Its re-run meets an error answer, or "paused".
			c.break_(t, s)
			if b, _, _ := s.claim(ctx, []int{0}); len(b) != 0 {
				t.Fatalf("re-run claimed %d batches through the %s answer", len(b), c.name)
			}
			c.mend_(t, s)

			got, _, err := s.claim(ctx, []int{0})
			if err != nil {
				t.Fatal(err)
			}
			var entries []string
			for _, b := range got {
				for _, task := range b.tasks {
					entries = append(entries, task.Entry)
				}
			}
			slices.Sort(entries)
			if !slices.Equal(entries, due) {
				t.Fatalf("after the %s answer, the next claim returned %v, want the lost claim's batch %v (left to its lease)", c.name, entries, due)
			}
		})
	}
}

// The audit's finding 2 (issue 20): on Redis Cluster a re-run job can
// still be on its way to a shard's old primary when the slot map changes;
// the shard's new primary is free, and a second job built then carried the
// same token: both returned the same batch, published twice with no lease
// expired. A shard with a claim on its way is in no other job until that
// claim answers. The slot move is forced: the job's primary is marked free
// as the shard's new primary would be.
func TestClaimTokenNeverInTwoJobs(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s := tokenScanner(t, rdb)
	scheduleDue(t, rdb, s, 5)
	s.prim.unanswered[0] = "lost-token"
	s.due.known[0] = 0

	first := s.prim.jobs(ctx, []int{0}, 10, 1)
	if len(first) != 1 || first[0].tokens[0] != "lost-token" {
		t.Fatalf("first job %+v, want the lost claim's token", first)
	}
	s.prim.started(&first[0])
	s.prim.node(first[0].node).claiming = false // the slot moved to a free primary

	if due := s.dueShards(4); slices.Contains(due, 0) {
		t.Errorf("shard 0 is due again while its claim is on its way: %v", due)
	}
	for _, j := range s.prim.jobs(ctx, []int{0}, 10, 1) {
		t.Fatalf("a second job with shard 0 while its claim is on its way: %+v", j)
	}
	s.prim.answered(first[0])
	if again := s.prim.jobs(ctx, []int{0}, 10, 1); len(again) != 1 {
		t.Fatalf("after the answer, shard 0 is in %d jobs, want 1", len(again))
	}
}

func tokenScanner(t *testing.T, rdb *redis.Client) *Scanner {
	t.Helper()
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, testenv.Redis(t), prefix)
	return New(rdb, nil, Options{Queue: "q", Shards: 1, KeyPrefix: prefix, BatchSize: 10, Pipeline: 4,
		PollInterval: 50 * time.Millisecond, Lease: 30 * time.Second, MaxAttempts: 3,
		RetryMin: time.Second, RetryMax: time.Second})
}

// scheduleDue adds n tasks to shard 0, due a second ago, and returns the
// in-flight entries a claim makes of them, sorted.
func scheduleDue(t *testing.T, rdb *redis.Client, s *Scanner, n int) []string {
	t.Helper()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	due := now.UnixMilli() - 1000
	var entries []string
	for k := 0; k < n; k++ {
		m := "task-" + string(rune('a'+k))
		if err := rdb.ZAdd(ctx, s.keys.Pending(0), redis.Z{Score: float64(due), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, EntryOf([]byte(m), due))
	}
	slices.Sort(entries)
	return entries
}

// A stalled primary runs, when it resumes, the claims every instance sent
// it meanwhile: instance A's claim (whose answer A gave up on), then B's.
// A runs its claim again with its token and must get its batch back,
// though B's claim came after it; before, the shard kept only its last
// claim's token, A's re-run claimed anew and A's batch waited out its
// 30 s lease (seen: a task 40 s late after a 10 s pause of a cluster
// primary, with two instances).
func TestLostClaimTokenSurvivesOtherInstancesClaims(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	a := tokenScanner(t, rdb)
	due := scheduleDue(t, rdb, a, 5)

	// A's claim runs; its answer is lost.
	if c, err := a.st.claimAs(ctx, 0, 10, "A/1"); err != nil || len(c.entries) != 5 {
		t.Fatalf("A's claim: %v %v", err, c.entries)
	}
	// Then B's claims, each taking a task that fell due since.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	const others = claimRecords - 1
	for k := range others {
		m := "b-task-" + strconv.Itoa(k)
		rdb.ZAdd(ctx, a.keys.Pending(0), redis.Z{Score: float64(now.UnixMilli() - 500), Member: m})
		if c, err := a.st.claimAs(ctx, 0, 10, "B/"+strconv.Itoa(k)); err != nil || len(c.entries) != 1 {
			t.Fatalf("B's claim %d: %v %v", k, err, c.entries)
		}
	}
	c, err := a.st.claimAs(ctx, 0, 10, "A/1")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(c.entries)
	if !slices.Equal(c.entries, due) {
		t.Fatalf("A's claim run again after %d claims of B returned %v, want its batch %v (left to its lease)", others, c.entries, due)
	}
	// The record keeps the last claimRecords claims, no more.
	for k := range claimRecords + 3 {
		rdb.ZAdd(ctx, a.keys.Pending(0), redis.Z{Score: float64(now.UnixMilli() - 500), Member: "c-task-" + strconv.Itoa(k)})
		if _, err := a.st.claimAs(ctx, 0, 10, "C/"+strconv.Itoa(k)); err != nil {
			t.Fatal(err)
		}
	}
	record := rdb.Get(ctx, a.keys.LastClaim(0)).Val()
	if f := strings.Fields(record); len(f) != 2*claimRecords || f[0] != "C/3" || f[len(f)-2] != "C/"+strconv.Itoa(claimRecords+2) {
		t.Errorf(":claim record %q, want the pairs of claims C/3 to C/%d", record, claimRecords+2)
	}
}

// A :claim record an older version wrote holds one pair, which reads the
// same: its claim run again gets its batch, and the next claim keeps that
// pair before its own. A record that is not pairs is replaced.
func TestClaimRecordOfAnOlderVersion(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	s := tokenScanner(t, rdb)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	deadline := now.UnixMilli() + 30_000
	e := EntryOf([]byte("held"), now.UnixMilli()-1000)
	rdb.ZAdd(ctx, s.keys.Inflight(0), redis.Z{Score: float64(deadline), Member: e})
	old := "old:1:ab/1 " + strconv.FormatInt(deadline, 10)
	rdb.Set(ctx, s.keys.LastClaim(0), old, 0)
	c, err := s.st.claimAs(ctx, 0, 10, "old:1:ab/1")
	if err != nil || !slices.Equal(c.entries, []string{e}) || c.deadline != deadline {
		t.Fatalf("older version's claim run again: %v %v deadline %d, want [%s] deadline %d", err, c.entries, c.deadline, e, deadline)
	}
	scheduleDue(t, rdb, s, 1)
	c, err = s.st.claimAs(ctx, 0, 10, "new/1")
	if err != nil || len(c.entries) != 1 || c.deadline <= deadline {
		t.Fatalf("next claim: %v %v deadline %d, want one entry and a deadline after %d", err, c.entries, c.deadline, deadline)
	}
	if got, want := rdb.Get(ctx, s.keys.LastClaim(0)).Val(), old+" new/1 "+strconv.FormatInt(c.deadline, 10); got != want {
		t.Errorf(":claim record %q, want %q", got, want)
	}

	// A token found whole only: not as the start or end of another.
	d := strconv.FormatInt(c.deadline, 10)
	rdb.Set(ctx, s.keys.LastClaim(0), "new/10 1 xnew/1 2 new/1 "+d, 0)
	if again, err := s.st.claimAs(ctx, 0, 10, "new/1"); err != nil || !slices.Equal(again.entries, c.entries) || again.deadline != c.deadline {
		t.Fatalf("claim run again among tokens it starts or ends: %v %v deadline %d, want %v deadline %d", err, again.entries, again.deadline, c.entries, c.deadline)
	}
	// A record of more pairs than kept (a version keeping more) is cut.
	var long []string
	for k := range claimRecords + 3 {
		long = append(long, "x/"+strconv.Itoa(k)+" "+strconv.Itoa(k+1))
	}
	rdb.Set(ctx, s.keys.LastClaim(0), strings.Join(long, " "), 0)
	rdb.ZAdd(ctx, s.keys.Pending(0), redis.Z{Score: float64(now.UnixMilli() - 500), Member: "more"})
	if c, err = s.st.claimAs(ctx, 0, 10, "new/3"); err != nil || len(c.entries) != 1 {
		t.Fatalf("claim over a long record: %v %v", err, c.entries)
	}
	if got, want := rdb.Get(ctx, s.keys.LastClaim(0)).Val(), strings.Join(append(long[4:], "new/3 "+strconv.FormatInt(c.deadline, 10)), " "); got != want {
		t.Errorf(":claim record %q, want %q", got, want)
	}

	rdb.Set(ctx, s.keys.LastClaim(0), "not pairs", 0)
	rdb.ZAdd(ctx, s.keys.Pending(0), redis.Z{Score: float64(now.UnixMilli() - 500), Member: "another"})
	c, err = s.st.claimAs(ctx, 0, 10, "new/2")
	if err != nil || len(c.entries) != 1 {
		t.Fatalf("claim over a record that is not pairs: %v %v", err, c.entries)
	}
	if got, want := rdb.Get(ctx, s.keys.LastClaim(0)).Val(), "new/2 "+strconv.FormatInt(c.deadline, 10); got != want {
		t.Errorf(":claim record %q, want %q", got, want)
	}
}
