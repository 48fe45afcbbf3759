package ingress

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// A backlog in the ingress queue is written to Redis in batches of up to
// the prefetch, not one or two messages a round trip: amqp091 hands
// deliveries over one at a time, and a receive that does not wait found at
// most the one on offer (2,000 waiting messages took 1,910 batches,
// and at 1,000 messages/s on a busy machine the ingest fell seconds
// behind). One TIME per batch, counted on a Redis of the test's own.
func TestBacklogIngestedInBatches(t *testing.T) {
	const n, prefetch = 2000, 256
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	ctx := context.Background()
	name := fmt.Sprintf("ingress-batch-%d", time.Now().UnixNano()%1_000_000_000)
	prod, err := shard.NewProducer(rdb, name, name, 4)
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.AMQPURL(t)
	g := New(rdb, prod, Options{Queue: name, Exchange: name + ".ingress", Prefetch: prefetch, QueueType: ClassicQueue,
		MaxDelay: time.Hour, Dial: func() (*amqp.Connection, error) { return amqp.Dial(url) }})
	if err := g.Setup(); err != nil {
		t.Fatal(err)
	}
	conn := testenv.AMQP(t)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(QueueName(name), false, false, false)
			_ = ch.ExchangeDelete(name+".ingress", false, false)
			ch.Close()
		}
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	for i := range n {
		err := ch.PublishWithContext(ctx, name+".ingress", "k", true, false, amqp.Publishing{
			MessageId: "m" + strconv.Itoa(i), Headers: amqp.Table{HeaderDelay: int32(3_600_000)}, Body: []byte("body")})
		if err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if c := <-confirms; !c.Ack {
			t.Fatal("publish nacked")
		}
	}
	before := timeCalls(t, rdb.Info(ctx, "commandstats").Val())

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); g.Run(runCtx) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		total := int64(0)
		for i := range 4 {
			total += rdb.ZCard(ctx, prod.Keys().Pending(i)).Val()
		}
		if total == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks in Redis after 30 s", total, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	batches := timeCalls(t, rdb.Info(ctx, "commandstats").Val()) - before
	t.Logf("%d messages in %d batches (prefetch %d)", n, batches, prefetch)
	if batches > n/10 {
		t.Errorf("%d messages took %d batches: fewer than 10 a batch with %d waiting", n, batches, n)
	}
}

// timeCalls reads the TIME calls from INFO commandstats.
func timeCalls(t *testing.T, info string) int {
	t.Helper()
	for l := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_time:calls="); ok {
			v, _, _ := strings.Cut(rest, ",")
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// roundTrips counts what a client sends to Redis: each command or pipeline
// is one round trip.
type roundTrips struct {
	mu    sync.Mutex
	trips int
	cmds  []string // each round trip's commands, space-separated
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add(cmd)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.add(cmds...)
		return next(ctx, cmds)
	}
}

func (r *roundTrips) add(cmds ...redis.Cmder) {
	names := make([]string, len(cmds))
	for n, c := range cmds {
		names[n] = c.Name()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips++
	r.cmds = append(r.cmds, strings.Join(names, " "))
}

func (r *roundTrips) take() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, c := r.trips, r.cmds
	r.trips, r.cmds = 0, nil
	return n, c
}

// Under steady traffic a batch is written in one round trip: the tasks'
// write, then in the same pipeline the batch's cancel marks and the Redis
// clock reading the next batch's due times are based on. Each message is
// published only once the one before is in Redis, so every batch holds
// one; and no due time is earlier than its publish by the Redis clock.
func TestSteadyBatchOneRoundTrip(t *testing.T) {
	const n = 20
	rdb := testenv.Redis(t)
	name := fmt.Sprintf("ingress-trips-%d", time.Now().UnixNano()%1_000_000_000)
	testenv.CleanRedis(t, rdb, name)
	opt := *rdb.Options()
	client := redis.NewClient(&opt)
	defer client.Close()
	trips := &roundTrips{}
	client.AddHook(trips)
	ctx := context.Background()
	prod, err := shard.NewProducer(client, name, name, 4)
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.AMQPURL(t)
	g := New(client, prod, Options{Queue: name, Exchange: name + ".ingress", Prefetch: 16, QueueType: ClassicQueue,
		MaxDelay: time.Hour, Dial: func() (*amqp.Connection, error) { return amqp.Dial(url) }})
	if err := g.Setup(); err != nil {
		t.Fatal(err)
	}
	conn := testenv.AMQP(t)
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(QueueName(name), false, false, false)
			_ = ch.ExchangeDelete(name+".ingress", false, false)
			ch.Close()
		}
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); g.Run(runCtx) }()
	defer func() { stop(); <-done }()
	publish := func(i int) (before int64) {
		before = rdb.Time(ctx).Val().UnixMilli()
		id := "m" + strconv.Itoa(i)
		if err := ch.PublishWithContext(ctx, name+".ingress", "k", false, false, amqp.Publishing{
			MessageId: id, Headers: amqp.Table{HeaderDelay: int32(3_600_000)}, Body: []byte("body")}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			score, err := rdb.ZScore(ctx, prod.Keys().Pending(shard.Index([]byte(id), 4)), id).Result()
			if err == nil {
				if due := int64(score); due < before+3_600_000 {
					t.Errorf("%s due %d: earlier than its publish (%d by the Redis clock) plus its x-delay", id, due, before)
				}
				return before
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not in Redis after 10 s", id)
			}
			time.Sleep(time.Millisecond)
		}
	}
	publish(0) // the first batch reads the clock on its own
	trips.take()
	for i := 1; i <= n; i++ {
		publish(i)
	}
	got, cmds := trips.take()
	t.Logf("%d batches in %d round trips: %q", n, got, cmds[:min(2, len(cmds))])
	if got != n {
		t.Errorf("%d batches of one message took %d round trips, want %d", n, got, n)
	}
}

// The clock estimate serves only while its reading is fresh, and takes it
// forward by the time since its command was sent (so it errs late, never
// early).
func TestRedisClockEstimate(t *testing.T) {
	var c redisClock
	if _, ok := c.now(); ok {
		t.Fatal("an estimate without a reading")
	}
	read := time.UnixMicro(1_800_000_000_123_456)
	sent := time.Now().Add(-20 * time.Millisecond)
	c.set(read, sent)
	ms, ok := c.now()
	if !ok {
		t.Fatal("a reading 20 ms old is not fresh")
	}
	if low := read.Add(20 * time.Millisecond).UnixMilli(); ms < low {
		t.Fatalf("estimate %d: earlier than the reading taken forward by its age (%d)", ms, low)
	}
	c.set(read, time.Now().Add(-ClockFresh))
	if _, ok := c.now(); ok {
		t.Fatalf("a reading %s old still serves", ClockFresh)
	}
}
