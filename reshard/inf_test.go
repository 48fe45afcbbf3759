package reshard_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// TestMoveInfiniteScore: a task scored +inf is never due, so a change of
// the shard count moves it like any task due later than the horizon; one
// scored -inf is due now and stays where it is, dispatched from there.
func TestMoveInfiniteScore(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	l := shard.Layout{Shards: 8, From: 4}
	var far, near string
	for i := 0; far == "" || near == ""; i++ {
		m := fmt.Sprint("m-", i)
		if shard.Index([]byte(m), 4) == shard.Index([]byte(m), 8) {
			continue
		}
		if far == "" {
			far = m
		} else {
			near = m
		}
	}
	rdb.ZAdd(ctx, k.Shard([]byte(far), 4), redis.Z{Score: math.Inf(1), Member: far})
	rdb.ZAdd(ctx, k.Shard([]byte(near), 4), redis.Z{Score: math.Inf(-1), Member: near})
	p, err := (&reshard.Mover{RDB: rdb, Keys: k}).Pass(ctx, l, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	if p.Moved != 1 || p.Near != 1 {
		t.Errorf("pass: %+v, want the +inf task moved and the -inf one left as due soon", p)
	}
	if s, err := rdb.ZScore(ctx, k.Shard([]byte(far), 8), far).Result(); err != nil || !math.IsInf(s, 1) {
		t.Errorf("+inf task in its new shard: score %v, %v", s, err)
	}
}
