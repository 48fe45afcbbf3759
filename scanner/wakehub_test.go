package scanner

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// syncBuffer is a log sink safe for the goroutines that write to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWakeHubOneConnection: the queues of an instance hear their wake
// channels and keyspace events over one subscription, each only its own;
// a queue whose channel the ACL refuses says so in its log and the others
// go on; a queue that stops leaves it; and after Redis closes the
// connection every queue hears again. On a private Redis with
// sorted-set keyspace events on.
func TestWakeHubOneConnection(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"notify-keyspace-events Kz"}})
	admin := srv.Client()
	ctx := context.Background()
	prefix := testenv.Name(t)
	const queues, refused = 8, 7
	// Every channel of the queues but the last one's wake channel, and
	// the keyspace patterns.
	allow := func(except ...int) {
		t.Helper()
		rules := []any{"ACL", "SETUSER", "app", "reset", "on", ">app-pw", "~*", "+@all"}
		for q := range queues {
			if slices.Contains(except, q) {
				continue
			}
			k := shard.Keys{Prefix: prefix, Queue: queueName(q)}
			// A pattern is allowed by its very text (ACL rules for PSUBSCRIBE).
			rules = append(rules, "&"+k.Wake(), "&__keyspace@0__:"+redisconn.GlobEscape(k.Prefix+":{"+k.Queue+":")+"*}")
		}
		if err := admin.Do(ctx, rules...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	allow(refused)
	opt, err := redis.ParseURL(srv.URLFor("app", "app-pw"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	hub := NewWakeHub(rdb, log)
	defer hub.Close()
	ws := make([]*wakeups, queues)
	stops := make([]context.CancelFunc, queues)
	var wg sync.WaitGroup
	defer wg.Wait()
	for q := range queues {
		k := shard.Keys{Prefix: prefix, Queue: queueName(q)}
		ws[q] = newWakeups(rdb, k, 4, time.Second, false, log.With("queue", k.Queue), newLogLimiter(log, time.Second))
		ws[q].hub = hub
		qctx, stop := context.WithCancel(ctx)
		stops[q] = stop
		defer stop()
		wg.Add(1)
		go func() { // as Scanner.Run does
			defer wg.Done()
			if unsubscribe := ws[q].listen(qctx); unsubscribe != nil {
				<-qctx.Done()
				unsubscribe()
			}
		}()
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				var subs []int64
				for q := range queues {
					subs = append(subs, numsubOf(admin, prefix, q))
				}
				t.Fatalf("not %s within 10s (subscribers by queue %v, patterns %d); log:\n%s", what, subs, admin.PubSubNumPat(ctx).Val(), logs.String())
			}
		}
	}
	numsub := func(q int) int64 { return numsubOf(admin, prefix, q) }
	waitFor("every allowed queue subscribed", func() bool {
		for q := range queues - 1 {
			if numsub(q) != 1 {
				return false
			}
		}
		return admin.PubSubNumPat(ctx).Val() == queues-1 // the refused queue subscribes no pattern
	})
	refusedLogged := func(q int) bool {
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "cannot subscribe to the wake channel") && strings.Contains(l, "queue="+queueName(q)+" ") {
				return true
			}
		}
		return false
	}
	waitFor("the refusal logged", func() bool { return refusedLogged(refused) })
	subs, err := admin.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(subs, "user=app"); n != 1 {
		t.Errorf("%d subscriptions for %d queues' wake-ups, want 1:\n%s", n, queues, subs)
	}
	// Subscribed, a queue keeps no goroutine of its own for its wake-ups:
	// the hub's hands them over (listen returns once Redis's answer is in).
	waitFor("no goroutine left in listen", func() bool {
		buf := make([]byte, 1<<22)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*wakeups).listen")
	})

	drain := func() {
		for _, w := range ws {
			select {
			case <-w.ch:
			default:
			}
			w.notes.take()
		}
	}
	// heardOnly checks that exactly queue q was woken, with shard i due.
	heardOnly := func(what string, q, i int) {
		t.Helper()
		waitFor(what, func() bool { return len(ws[q].ch) == 1 })
		time.Sleep(50 * time.Millisecond) // a stray delivery to another queue would be in by now
		for o, w := range ws {
			if o != q && len(w.ch) != 0 {
				t.Fatalf("%s: queue %d woken too", what, o)
			}
		}
		if _, _, soon := ws[q].notes.take(); len(soon) != 1 || !has(soon, i) {
			t.Fatalf("%s: notes %v, want shard %d", what, soon, i)
		}
		drain()
	}
	drain()
	admin.Publish(ctx, ws[3].keys.Wake(), shard.WakeDue(2, 1234))
	heardOnly("queue 3 woken by a producer's wake-up", 3, 2)
	admin.ZAdd(ctx, ws[5].keys.Pending(1), redis.Z{Score: 1, Member: "raw"})
	heardOnly("queue 5 woken by a keyspace event", 5, 1)

	// A queue that stops leaves the subscription; the others stay.
	stops[4]()
	waitFor("queue 4 unsubscribed", func() bool { return numsub(4) == 0 })
	if numsub(3) != 1 {
		t.Fatal("queue 3 unsubscribed when queue 4 stopped")
	}

	// Redis closes the connection: go-redis reconnects and subscribes
	// every channel and pattern again.
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("subscribed again", func() bool { return numsub(3) == 1 && numsub(6) == 1 })
	admin.Publish(ctx, ws[6].keys.Wake(), shard.WakeDue(3, 99))
	heardOnly("queue 6 woken after the reconnect", 6, 3)
	admin.ZAdd(ctx, ws[0].keys.Pending(2), redis.Z{Score: 1, Member: "raw"})
	heardOnly("queue 0 woken by a keyspace event after the reconnect", 0, 2)

	// The ACL loses queue 6's channels: Redis closes the subscription, and
	// go-redis's resubscription of every channel in one command is refused
	// whole. Queue 6 is told; the others hear again.
	allow(refused, 6)
	waitFor("queue 6's refusal logged", func() bool { return refusedLogged(6) })
	for q := range queues {
		if q != 6 && q != refused && refusedLogged(q) {
			t.Fatalf("queue %d's channel logged as refused: another queue's refusal blamed on it", q)
		}
	}
	waitFor("the other queues subscribed again", func() bool { return numsub(3) == 1 && numsub(0) == 1 })
	admin.Publish(ctx, ws[3].keys.Wake(), shard.WakeDue(1, 5))
	heardOnly("queue 3 woken after another queue's channel was refused", 3, 1)
	admin.ZAdd(ctx, ws[5].keys.Pending(3), redis.Z{Score: 1, Member: "raw"})
	heardOnly("queue 5 woken by a keyspace event after another queue's channel was refused", 5, 3)
}

func numsubOf(admin *redis.Client, prefix string, q int) int64 {
	ch := shard.Keys{Prefix: prefix, Queue: queueName(q)}.Wake()
	return admin.PubSubNumSub(context.Background(), ch).Val()[ch]
}

func has(m map[int]int64, i int) bool { _, ok := m[i]; return ok }

func queueName(q int) string { return "q" + string(rune('a'+q)) }

// TestWakeHubBacksOff: a subscription whose connection Redis keeps
// refusing (a wrong password) is tried again with a growing pause, not in
// a loop, and its refusals are not taken for a channel's: nothing is
// logged as refused or reopened.
func TestWakeHubBacksOff(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">right", "allchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(srv.URLFor("app", "wrong"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var logs syncBuffer
	hub := NewWakeHub(rdb, slog.New(slog.NewTextHandler(&logs, nil)))
	defer hub.Close()
	refused := false
	if err := hub.subscribe(ctx, "ch", false, func(*redis.Message) {}, func(error) { refused = true }); err != nil {
		t.Fatalf("subscribe on a connection Redis refuses: %v, want nil (a connection error)", err)
	}
	connections := func() int64 {
		n, err := strconv.ParseInt(redisInfoField(admin.Info(ctx, "stats").Val(), "total_connections_received"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := connections()
	time.Sleep(2 * time.Second)
	tried := connections() - before
	t.Logf("%d connections tried in 2 s", tried)
	if tried > 30 { // 100 ms doubling to 2 s: about 5; go-redis may dial a few times each
		t.Errorf("%d connections in 2 s: the hub retries a refused connection in a loop", tried)
	}
	if refused || strings.Contains(logs.String(), "opening the wake-up subscription again") {
		t.Errorf("a refused connection taken for a refused channel:\n%s", logs.String())
	}
}

// redisInfoField reads one field of an INFO reply.
func redisInfoField(info, field string) string {
	for l := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v
		}
	}
	return ""
}
