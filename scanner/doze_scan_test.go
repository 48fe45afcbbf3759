package scanner

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// lookCommands returns the names of the look's commands Redis ran since
// the last SLOWLOG RESET (slowlog-log-slower-than 0 logs every command),
// in order, and resets the log.
func lookCommands(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	ctx := context.Background()
	logs, err := rdb.SlowLogGet(ctx, 100000).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for n := len(logs) - 1; n >= 0; n-- {
		switch name := strings.ToLower(logs[n].Args[0]); name {
		case "evalsha", "eval", "dbsize", "scan", "exists":
			out = append(out, name)
		}
	}
	rdb.SlowLogReset(ctx)
	return out
}

// TestIdleLookScansASmallKeyspace: on a keyspace of at most a quarter as
// many keys as the dozing queues' sets, the look finds the sets that
// exist with one SCAN (and a DBSIZE for the next look's choice) instead
// of EXISTS: it wakes the queue with a pending task and the one with a
// task in flight, not the one holding only a dead letter nor the others;
// it asks EXISTS again once the keyspace grew past the rule, when its
// COUNT fell short of the keyspace, and for good once Redis refused SCAN.
func TestIdleLookScansASmallKeyspace(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := srv.Client()
	ctx := context.Background()
	for _, set := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "100000"}} {
		if err := admin.ConfigSet(ctx, set[0], set[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(srv.URLFor("app", "app-pw"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	if err := idleScript.Load(ctx, admin).Err(); err != nil {
		t.Fatal(err)
	}
	w := &IdleWatch{rdb: rdb, dozing: map[*dozer]struct{}{}}
	ready := func() bool { return true }
	names := []string{"pending", "inflight", "dead", "q3", "q4", "q5"}
	ds := map[string]*dozer{}
	q := func(name string) shard.Keys { return shard.Keys{Prefix: "dq", Queue: name} }
	for _, name := range names {
		ds[name] = newDozer(q(name), 16, true, "me", time.Minute, ready)
		w.add(ds[name])
	}
	// 6 queues x 32 sets = 192 keys: a scan while the keyspace is at most
	// 48 (10 here).
	setup := func() {
		for _, name := range names {
			admin.Set(ctx, q(name).Sweeper(), "me", time.Minute)
		}
		admin.ZAdd(ctx, q("pending").Pending(15), redis.Z{Score: 1, Member: "a"})
		admin.ZAdd(ctx, q("inflight").Inflight(3), redis.Z{Score: 1, Member: "a"})
		admin.ZAdd(ctx, q("dead").Dead(0), redis.Z{Score: 1, Member: "a"})
		admin.Set(ctx, "other", "x", 0)
	}
	setup()
	woken := func() []string {
		var out []string
		for _, name := range names {
			select {
			case <-ds[name].nudge:
				out = append(out, name)
			default:
			}
		}
		return out
	}
	want := "pending inflight"
	look := func(what, wantCmds string) {
		t.Helper()
		lookCommands(t, admin)
		w.look()
		if got := strings.Join(woken(), " "); got != want {
			t.Errorf("%s: woke %q, want %q", what, got, want)
		}
		if got := strings.Join(lookCommands(t, admin), " "); got != wantCmds {
			t.Errorf("%s: Redis ran %q, want %q", what, got, wantCmds)
		}
	}
	// One EXISTS of all the sets, then one per queue of the group that
	// holds something.
	exists := strings.Repeat(" exists", 1+len(names))
	look("first look: the keyspace's size unknown", "evalsha dbsize"+exists)
	look("small keyspace", "evalsha dbsize scan")

	for i := range 40 {
		admin.Set(ctx, "other"+strconv.Itoa(i), "x", 0)
	}
	look("the keyspace grew past the rule: still its last size", "evalsha dbsize scan")
	look("the keyspace past the rule", "evalsha dbsize"+exists)

	// A keyspace of more buckets than ten times the COUNT (SCAN's most per
	// call) of a size read before it grew: the scan comes back incomplete.
	pipe := admin.Pipeline()
	for i := range 12000 {
		pipe.Set(ctx, "big"+strconv.Itoa(i), "x", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	w.dbsize = 1
	look("COUNT short of the keyspace", "evalsha dbsize scan"+exists)
	// A new table (FLUSHDB) of the keys before: small again.
	admin.FlushDB(ctx)
	setup()
	look("its size read with the large keyspace", "evalsha dbsize"+exists)
	look("small again, the scans paused after an incomplete one", "evalsha dbsize"+exists)
	w.unscan = 0 // as scanLookPause looks later
	look("small again, the pause over", "evalsha dbsize scan")

	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "-scan").Err(); err != nil {
		t.Fatal(err)
	}
	look("SCAN refused", "evalsha dbsize"+exists)
	look("after the refusal", "evalsha"+exists)

	// An error reply other than a refusal does not stop the scans.
	w.refused = false
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "+scan").Err(); err != nil {
		t.Fatal(err)
	}
	err = admin.Get(ctx, q("pending").Pending(15)).Err()
	if !isReply(err) {
		t.Fatalf("GET of a sorted set: %v, want an error reply", err)
	}
	w.refuse("SCAN", err)
	look("after another error reply", "evalsha dbsize scan")
}

// TestLookPlanQueueOf: a key the scan returns is read back to the dozing
// queue whose pending or in-flight set it is, whatever the queue's name
// holds, and to none otherwise.
func TestLookPlanQueueOf(t *testing.T) {
	ready := func() bool { return true }
	a := newDozer(shard.Keys{Prefix: "dq", Queue: "a"}, 4, true, "me", time.Second, ready)
	odd := newDozer(shard.Keys{Prefix: "dq", Queue: "x:1}:y"}, 2, true, "me", time.Second, ready)
	p := newLookPlan(1, []*dozer{a, odd})
	if p.pattern != `dq:{*:*}*` {
		t.Errorf("pattern %q", p.pattern)
	}
	for k, want := range map[string]*dozer{
		"dq:{a:0}": a, "dq:{a:3}:inflight": a, "dq:{x:1}:y:1}": odd, "dq:{x:1}:y:0}:inflight": odd,
		"dq:{a:4}": nil, "dq:{a:03}": nil, "dq:{a:-1}": nil, "dq:{a:0}:dead": nil, "dq:{a:0}:inflight:x": nil,
		"dq:{b:0}": nil, "dr:{a:0}": nil, "dq:{a}": nil, "dq:{x:1}:y:2}": nil, "dq:{a:1": nil,
	} {
		if got := p.queueOf(k); got != want {
			t.Errorf("queueOf(%q) = %v, want %v", k, got, want)
		}
	}
	other := newDozer(shard.Keys{Prefix: "other", Queue: "a"}, 4, true, "me", time.Second, ready)
	if p := newLookPlan(1, []*dozer{a, other}); p.pattern != "" {
		t.Errorf("queues of two prefixes: pattern %q, want none (no scan)", p.pattern)
	}
}
