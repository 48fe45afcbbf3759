package reshard_test

import (
	"context"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// TestRescheduleWithLayoutReadBeforeTheChange: a producer that read the
// layout just before `reshard` started (and so still hashes with the old
// count) reschedules every task while the change begins. No reschedule may
// be undone by the move: after finish every task is pending once, at its
// new due time, in its shard by the new count. (Before the move waited for
// producers' layouts to settle, about half of them were back at the old due
// time: sent early.)
func TestRescheduleWithLayoutReadBeforeTheChange(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	p, members, _, later := scheduled(t, rdb, k, 200)
	if l := p.Layout(ctx); l != (shard.Layout{Shards: 4}) { // read now, used for the next second
		t.Fatalf("layout %+v", l)
	}
	moved := make(chan error, 1)
	go func() {
		_, _, err := reshard.Reshard(ctx, rdb, k, 8, reshard.Options{Name: "test"})
		moved <- err
	}()
	time.Sleep(20 * time.Millisecond)
	notPending := 0
	for _, m := range members {
		switch err := p.Reschedule(ctx, m, later); err {
		case nil:
		case shard.ErrNotPending:
			notPending++
		default:
			t.Fatal(err)
		}
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if _, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	early, missing := 0, 0
	for _, m := range members {
		i := shard.Index(m, 8)
		score, err := rdb.ZScore(ctx, k.Pending(i), string(m)).Result()
		if err != nil {
			missing++
			continue
		}
		if int64(score) != later.UnixMilli() {
			early++
		}
	}
	total := 0
	for i := 0; i < 8; i++ {
		total += int(rdb.ZCard(ctx, k.Pending(i)).Val())
	}
	if notPending > 0 || early > 0 || missing > 0 || total != len(members) {
		t.Fatalf("of %d rescheduled: %d answered not pending, %d back at the old due time, %d not in their shard; %d pending in all",
			len(members), notPending, early, missing, total)
	}
}
