package bench

import (
	"fmt"
	"slices"
)

// Point is one measurement: a mode and the settings it runs with.
type Point struct {
	Mode      string `json:"mode"`
	Backlog   int    `json:"backlog,omitempty"` // tasks pending at the start (backlog, idle)
	Window    int    `json:"window,omitempty"`  // of which due now (backlog)
	Rate      int    `json:"rate,omitempty"`    // tasks/s (rate)
	Instances int    `json:"instances"`
	Queues    int    `json:"queues,omitempty"` // queues the instances serve (idle, rate); 0 means 1
	Shards    int    `json:"shards"`
	Batch     int    `json:"batch,omitempty"`
	Size      int    `json:"size"`
	MaxRate   int    `json:"max_rate,omitempty"` // the queue's MAX_RATE (burst)
}

func (p Point) maxRateText() string {
	if p.MaxRate > 0 {
		return fmt.Sprintf(" max-rate=%d", p.MaxRate)
	}
	return ""
}

func (p Point) String() string {
	switch p.Mode {
	case modeBacklog:
		return fmt.Sprintf("backlog N=%s due=%s instances=%d shards=%d batch=%d size=%d",
			thousands(p.Backlog), thousands(p.Window), p.Instances, p.Shards, p.Batch, p.Size)
	case modeRate:
		return fmt.Sprintf("rate %s/s%s instances=%d shards=%d batch=%d size=%d",
			thousands(p.Rate), p.queuesText(), p.Instances, p.Shards, p.Batch, p.Size)
	case modeMemory:
		return fmt.Sprintf("memory N=%s shards=%d size=%d", thousands(p.Backlog), p.Shards, p.Size)
	case modeBurst:
		return fmt.Sprintf("burst N=%s due at once instances=%d shards=%d batch=%d size=%d%s",
			thousands(p.Backlog), p.Instances, p.Shards, p.Batch, p.Size, p.maxRateText())
	default:
		if p.Instances == 0 {
			return fmt.Sprintf("idle background (no instance) pending=%s", thousands(p.Backlog))
		}
		return fmt.Sprintf("idle instances=%d%s shards=%d pending=%s", p.Instances, p.queuesText(), p.Shards, thousands(p.Backlog))
	}
}

// queuesText is " queues=Q" for more than one queue, else empty.
func (p Point) queuesText() string {
	if p.Queues > 1 {
		return fmt.Sprintf(" queues=%d", p.Queues)
	}
	return ""
}

// plan lists the points to measure, mode by mode. Without cross, the
// first value of every list is the base point, and each list with more
// values is swept on its own with the others held at their base; with
// cross, every combination is run.
func plan(o *Options) []Point {
	var out []Point
	for _, mode := range o.Modes {
		var dims [][]int
		switch mode {
		case modeBacklog, modeBurst, modeMemory:
			dims = [][]int{o.Backlogs, o.Instances, o.Shards, o.Batches, o.Sizes}
		case modeRate:
			dims = [][]int{o.Rates, o.Instances, o.Shards, o.Batches, o.Sizes, queuesOr1(o.Queues)}
		case modeIdle:
			dims = [][]int{o.Instances, o.Shards, queuesOr1(o.Queues)}
		}
		if mode == modeIdle {
			// First Redis's load with no instance at all: what the idle
			// figures stand on (other clients, on a shared Redis).
			out = append(out, Point{Mode: modeIdle, Shards: o.Shards[0], Queues: 1, Backlog: o.IdleTasks, Batch: o.Batches[0], Size: o.Sizes[0]})
		}
		for _, c := range combos(dims, o.Cross) {
			p := Point{Mode: mode}
			switch mode {
			case modeMemory:
				p.Backlog, p.Shards, p.Size = c[0], c[2], c[4]
			case modeBurst:
				p.Backlog, p.Instances, p.Shards, p.Batch, p.Size = c[0], c[1], c[2], c[3], c[4]
				p.MaxRate = o.MaxRate
			case modeBacklog:
				p.Backlog, p.Instances, p.Shards, p.Batch, p.Size = c[0], c[1], c[2], c[3], c[4]
				p.Window = p.Backlog
				if !o.Drain {
					p.Window = min(p.Backlog, o.Window)
				}
			case modeRate:
				p.Rate, p.Instances, p.Shards, p.Batch, p.Size, p.Queues = c[0], c[1], c[2], c[3], c[4], c[5]
			case modeIdle:
				p.Instances, p.Shards, p.Queues = c[0], c[1], c[2]
				p.Backlog, p.Batch, p.Size = o.IdleTasks, o.Batches[0], o.Sizes[0]
			}
			out = append(out, p)
		}
	}
	return out
}

// queuesOr1 is the -queues list, or 1 when there is none (Options made
// by hand).
func queuesOr1(q []int) []int {
	if len(q) == 0 {
		return []int{1}
	}
	return q
}

// combos returns the value combinations of dims: all of them with cross,
// otherwise the base (every first value) and then one dimension varied at
// a time. Repeats are dropped.
func combos(dims [][]int, cross bool) [][]int {
	base := make([]int, len(dims))
	for i, d := range dims {
		base[i] = d[0]
	}
	out := [][]int{}
	add := func(c []int) {
		for _, o := range out {
			if slices.Equal(o, c) {
				return
			}
		}
		out = append(out, slices.Clone(c))
	}
	if cross {
		var walk func(i int, cur []int)
		walk = func(i int, cur []int) {
			if i == len(dims) {
				add(cur)
				return
			}
			for _, v := range dims[i] {
				walk(i+1, append(cur, v))
			}
		}
		walk(0, nil)
		return out
	}
	add(base)
	for i, d := range dims {
		for _, v := range d[1:] {
			c := slices.Clone(base)
			c[i] = v
			add(c)
		}
	}
	return out
}
