// Command slottable prints the markdown tables of docs/cluster-slots.md:
// how the shards of a queue spread over the primaries of a Redis Cluster
// whose slots redis-cli --cluster create allocated.
//
//	go -C shard run ./internal/slottable [-primaries 3] [-names 10000]
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/dispatcher/dispatcher/shard"
)

// layout returns, for each slot, the primary that redis-cli --cluster
// create gives it: n contiguous ranges, primary j ending at
// round((j+1)*16384/n - 1), the last one at 16383.
func layout(n int) (owner [shard.SlotCount]int, ranges [][2]int) {
	per := float64(shard.SlotCount) / float64(n)
	first, cursor := 0, 0.0
	for j := range n {
		last := int(math.Round(cursor + per - 1))
		if last > shard.SlotCount || j == n-1 {
			last = shard.SlotCount - 1
		}
		last = max(last, first)
		for s := first; s <= last; s++ {
			owner[s] = j
		}
		ranges = append(ranges, [2]int{first, last})
		first = last + 1
		cursor += per
	}
	return owner, ranges
}

// counts is how many of a queue's m shards land on each primary.
func counts(owner *[shard.SlotCount]int, n int, slot func(i int) int, m int) []int {
	c := make([]int, n)
	for i := range m {
		c[owner[slot(i)]]++
	}
	return c
}

// stats summarises the busiest primary over many queues.
type stats struct {
	mean, p1, p99 float64 // busiest primary's shard count
	empty         float64 // fraction of queues leaving some primary without a shard
}

func summarise(busiest []int, empty int) stats {
	slices.Sort(busiest)
	sum := 0
	for _, b := range busiest {
		sum += b
	}
	rank := func(p float64) float64 { // nearest rank
		i := int(math.Ceil(p*float64(len(busiest)))) - 1
		return float64(busiest[max(i, 0)])
	}
	return stats{
		mean:  float64(sum) / float64(len(busiest)),
		p1:    rank(0.01),
		p99:   rank(0.99),
		empty: float64(empty) / float64(len(busiest)),
	}
}

func main() {
	n := flag.Int("primaries", 3, "number of primaries")
	names := flag.Int("names", 10000, "queue names queue-0 ... queue-<names-1> for table 2")
	flag.Parse()
	if *n < 1 || *n > shard.SlotCount || *names < 1 {
		fmt.Fprintln(os.Stderr, "slottable: bad -primaries or -names")
		os.Exit(2)
	}
	owner, ranges := layout(*n)

	var rs []string
	for j, r := range ranges {
		rs = append(rs, fmt.Sprintf("%c %d–%d", 'A'+j%26, r[0], r[1]))
	}
	fmt.Printf("Primaries (slots): %s.\n\n", strings.Join(rs, ", "))

	// Table 1: a few queue names.
	fmt.Printf("Table 1: shards per primary (ideal M/%d)\n\n", *n)
	fmt.Print("| queue | M | ideal |")
	for j := range *n {
		fmt.Printf(" %c |", 'A'+j%26)
	}
	fmt.Print(" busiest ÷ ideal |\n|---|---:|---:|")
	fmt.Print(strings.Repeat("---:|", *n+1), "\n")
	for _, m := range []int{16, 64, 256} {
		for _, q := range []string{"default", "orders", "emails", "q"} {
			k := shard.Keys{Prefix: shard.DefaultPrefix, Queue: q}
			c := counts(&owner, *n, k.ShardSlot, m)
			ideal := float64(m) / float64(*n)
			fmt.Printf("| `%s` | %d | %.1f |", q, m, ideal)
			for _, x := range c {
				fmt.Printf(" %d |", x)
			}
			fmt.Printf(" %.2f |\n", float64(slices.Max(c))/ideal)
		}
	}

	// Table 2: many queue names, against slots drawn uniformly at random.
	rng := rand.New(rand.NewPCG(1, 1))
	uniform := func(int) int { return rng.IntN(shard.SlotCount) }
	fmt.Printf("\nTable 2: busiest primary over %d queues `queue-0`…`queue-%d` "+
		"(CRC16), and over as many draws of uniformly random slots (random)\n\n", *names, *names-1)
	fmt.Println("| M | ideal | busiest mean | p1 | p99 | mean ÷ ideal | p99 ÷ ideal | P(a primary has no shard) | random: mean | random: p99 | random: P(no shard) |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, m := range []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 1024, 4096} {
		var crc, rnd []int
		crcEmpty, rndEmpty := 0, 0
		for q := range *names {
			k := shard.Keys{Prefix: shard.DefaultPrefix, Queue: "queue-" + strconv.Itoa(q)}
			c := counts(&owner, *n, k.ShardSlot, m)
			crc = append(crc, slices.Max(c))
			if slices.Min(c) == 0 {
				crcEmpty++
			}
			c = counts(&owner, *n, uniform, m)
			rnd = append(rnd, slices.Max(c))
			if slices.Min(c) == 0 {
				rndEmpty++
			}
		}
		s, r := summarise(crc, crcEmpty), summarise(rnd, rndEmpty)
		ideal := float64(m) / float64(*n)
		fmt.Printf("| %d | %.2f | %.2f | %.0f | %.0f | %.2f | %.2f | %.4f | %.2f | %.0f | %.4f |\n",
			m, ideal, s.mean, s.p1, s.p99, s.mean/ideal, s.p99/ideal, s.empty, r.mean, r.p99, r.empty)
	}
}
