package browse

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

// entry is a sorted-set entry of the model Read is checked against.
type entry struct {
	score  float64
	member string
}

// byPos is a sorted set's order: score, then member byte by byte.
func byPos(a, b entry) int {
	return cmp.Or(cmp.Compare(a.score, b.score), cmp.Compare(a.member, b.member))
}

// model is what Read should return: the first n entries of es (sorted)
// after p in order o, within r.
func model(es []entry, r Range, o Order, p *Pos, n int) []entry {
	in := func(s float64) bool {
		return (s > r.Min.Score || (s == r.Min.Score && !r.Min.Open)) &&
			(s < r.Max.Score || (s == r.Max.Score && !r.Max.Open))
	}
	var out []entry
	for k := range es {
		e := es[k]
		if o == Desc {
			e = es[len(es)-1-k]
		}
		if !in(e.score) {
			continue
		}
		if p != nil {
			c := byPos(e, entry{p.Score, p.Member})
			if (o == Asc && c <= 0) || (o == Desc && c >= 0) {
				continue
			}
		}
		if len(out) == n {
			break
		}
		out = append(out, e)
	}
	return out
}

func entries(zs []redis.Z) []entry {
	out := make([]entry, len(zs))
	for k, z := range zs {
		out[k] = entry{z.Score, z.Member.(string)}
	}
	return out
}

// tieSet fills key with 600 entries: 400 of them tied at score 10, with
// members whose byte order differs from a locale's (case, bytes over
// 0x7f, prefixes), the rest at 5, 15 and 20.
func tieSet(t *testing.T, rdb redis.UniversalClient, key string) []entry {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "B", "b", "Z", "\xff", "\x00", "é", "-", "ab"}
	seen := map[string]bool{}
	var es []entry
	for len(es) < 600 {
		m := ""
		for range 1 + rng.IntN(4) {
			m += alphabet[rng.IntN(len(alphabet))]
		}
		if seen[m] {
			continue
		}
		seen[m] = true
		score := 10.0
		if len(es) >= 400 {
			score = []float64{5, 15, 20}[rng.IntN(3)]
		}
		es = append(es, entry{score, m})
	}
	zs := make([]redis.Z, len(es))
	for k, e := range es {
		zs[k] = redis.Z{Score: e.score, Member: e.member}
	}
	if err := rdb.ZAdd(context.Background(), key, zs...).Err(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(es, byPos)
	return es
}

// TestReadMatchesModel reads from many positions (members there, members
// never there, scores between and beyond the entries'), both ways, within
// ranges open and closed at either end, and compares with the model.
func TestReadMatchesModel(t *testing.T) {
	rdb, k := setup(t)
	ctx := context.Background()
	key := k.Pending(0)
	es := tieSet(t, rdb, key)
	rng := rand.New(rand.NewPCG(5, 6))
	scores := []float64{math.Inf(-1), 0, 5, 7, 10, 12, 15, 20, 30, math.Inf(1)}
	for range 1500 {
		var p *Pos
		switch rng.IntN(4) {
		case 0: // from the start
		case 1: // a member there
			e := es[rng.IntN(len(es))]
			p = &Pos{Score: e.score, Member: e.member}
		case 2: // a member there, at another score: not where it is
			e := es[rng.IntN(len(es))]
			p = &Pos{Score: scores[rng.IntN(len(scores))], Member: e.member}
		default: // a member never there
			p = &Pos{Score: scores[rng.IntN(len(scores))], Member: fmt.Sprintf("b%dZ", rng.IntN(100))}
		}
		r := Range{
			Min: Bound{Score: scores[rng.IntN(len(scores))], Open: rng.IntN(2) == 0},
			Max: Bound{Score: scores[rng.IntN(len(scores))], Open: rng.IntN(2) == 0},
		}
		o := Order(rng.IntN(2) == 0)
		n := 1 + rng.IntN(50)
		zs, more, err := Read(ctx, rdb, key, r, o, p, n)
		if err != nil {
			t.Fatal(err)
		}
		want := model(es, r, o, p, n)
		if got := entries(zs); !slices.Equal(got, want) || more != (len(want) == n) {
			t.Fatalf("Read %s..%s desc=%v after %+v, %d: got %v (more %v), want %v", r.Min, r.Max, o, p, n, got, more, want)
		}
	}
}

// TestReadDescCursorLeft walks a set down in small batches, 400 of its
// entries on one score, removing the cursor's own entry and the next
// below it after every batch, and moving another above the cursor (as a
// reschedule later does): every entry that stayed is met once, in order,
// and none that moved behind the cursor is met again.
func TestReadDescCursorLeft(t *testing.T) {
	rdb, k := setup(t)
	ctx := context.Background()
	key := k.Pending(0)
	es := tieSet(t, rdb, key)
	r := Range{Min: Bound{Score: 5, Open: true}, Max: Bound{Score: 20}}
	removed := map[string]bool{}
	var got []entry
	var p *Pos
	for {
		zs, more, err := Read(ctx, rdb, key, r, Desc, p, 7)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, entries(zs)...)
		if !more {
			break
		}
		last := zs[len(zs)-1]
		p = &Pos{Score: last.Score, Member: last.Member.(string)}
		// The cursor's entry leaves, and the next one below it.
		rdb.ZRem(ctx, key, p.Member)
		removed[p.Member] = true
		if next := model(es, r, Desc, p, 1); len(next) == 1 && !removed[next[0].member] {
			rdb.ZRem(ctx, key, next[0].member)
			removed[next[0].member] = true
		}
		// One met already moves later, behind the cursor.
		rdb.ZAdd(ctx, key, redis.Z{Score: 20, Member: zs[0].Member.(string)})
	}
	var want []entry
	for _, e := range slices.Backward(es) {
		if e.score > 5 && e.score <= 20 {
			want = append(want, e)
		}
	}
	n := 0
	for _, w := range want {
		if n < len(got) && got[n] == w {
			n++
		} else if !removed[w.member] {
			t.Fatalf("%q at %v, never removed, was not met in its place (got %d entries)", w.member, w.score, len(got))
		}
	}
	if n != len(got) {
		t.Fatalf("met %d entries, %d of them in the set's order: %v", len(got), n, got[n:])
	}
	if len(removed) < 100 {
		t.Fatalf("only %d removed: the test did not walk the ties", len(removed))
	}
}
