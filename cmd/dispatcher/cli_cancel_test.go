package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/recurring"
	"github.com/dispatcher/dispatcher/shard"
)

// TestRemovalPathsTakeProperties walks every command that removes a
// pending member: each takes the member's properties with it, so a later
// plain task with the same body, scheduled without any, does not go out
// with a removed task's (or schedule's) routing key and headers.
func TestRemovalPathsTakeProperties(t *testing.T) {
	const m = 4
	prefix, rdb := cliEnv(t, map[string]string{"DISPATCHER_QUEUES": "q", "DISPATCHER_QUEUE_Q_SHARDS": fmt.Sprint(m), "DISPATCHER_QUEUE_Q_EXCHANGE": "x"})
	recordShards(t, rdb, prefix, "q", m)
	ctx := context.Background()
	keys := shard.Keys{Prefix: prefix, Queue: "q"}
	const body = "report"
	i := shard.Index([]byte(body), m)
	props := `{"routing_key":"cron","headers":{"src":"cron"}}`
	// pendingWithProps is a recurring occurrence as the materialiser
	// writes it: the body as a plain member, with properties.
	pendingWithProps := func(t *testing.T) {
		t.Helper()
		pipe := rdb.TxPipeline()
		pipe.ZAdd(ctx, keys.Pending(i), redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: body})
		pipe.HSet(ctx, keys.Props(i), body, props)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		run  func(t *testing.T) (args []string)
	}{
		{"cancel BODY", func(t *testing.T) []string {
			pendingWithProps(t)
			return []string{"cancel", "--queue", "q", body}
		}},
		{"cancel --match", func(t *testing.T) []string {
			pendingWithProps(t)
			return []string{"cancel", "--queue", "q", "--match", body}
		}},
		{"cancel --id", func(t *testing.T) []string {
			if _, errOut, code := runCLI(t, "schedule", "--queue", "q", "--id", body, "--in", "1h",
				"--routing-key", "cron", "--header", "src=cron", "the body"); code != exitOK {
				t.Fatalf("schedule --id: exit %d %q", code, errOut)
			}
			return []string{"cancel", "--queue", "q", "--id", body}
		}},
		{"recurring remove after a bare ZREM", func(t *testing.T) []string {
			if _, errOut, code := runCLI(t, "recurring", "add", "--queue", "q", "--name", "r", "--cron", "@hourly",
				"--routing-key", "cron", "--header", "src=cron", body); code != exitOK {
				t.Fatalf("recurring add: exit %d %q", code, errOut)
			}
			defs, _, err := recurring.NewStore(rdb, keys).Defs(ctx)
			if err != nil || len(defs) != 1 {
				t.Fatalf("defs %+v, %v", defs, err)
			}
			// Its occurrence, materialised under the definition's revision,
			// then cancelled by a producer of its own with a bare ZREM.
			pendingWithProps(t)
			due := rdb.ZScore(ctx, keys.Pending(i), body).Val()
			rdb.HSet(ctx, keys.RecurringState(i), "r", fmt.Sprintf("%d:%d:", defs[0].Rev, int64(due)))
			rdb.ZRem(ctx, keys.Pending(i), body)
			return []string{"recurring", "remove", "--queue", "q", "--name", "r"}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := c.run(t)
			if _, errOut, code := runCLI(t, args...); code != exitOK {
				t.Fatalf("%v: exit %d %q", args, code, errOut)
			}
			if n := rdb.ZCard(ctx, keys.Pending(i)).Val(); n != 0 {
				t.Fatalf("%v: %d pending left", args, n)
			}
			if p := rdb.HGet(ctx, keys.Props(i), body).Val(); p != "" {
				t.Fatalf("%v left the properties %s: a later plain task %q would carry them", args, p, body)
			}
		})
	}
}
