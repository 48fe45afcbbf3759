package bench

import (
	"fmt"
	"slices"
	"strings"
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
	// Drain: an ingress point whose Backlog messages are all published
	// before the instances start (-ingress-drain).
	Drain bool `json:"drain,omitempty"`
	// IDs: tasks are scheduled by id (-ids), with properties when Props
	// (-props); else as plain members.
	IDs   bool `json:"ids,omitempty"`
	Props bool `json:"props,omitempty"`
}

// formText is how the point's tasks are scheduled: " ids", " ids+props",
// or nothing for plain members.
func (p Point) formText() string {
	switch {
	case p.IDs && p.Props:
		return " ids+props"
	case p.IDs:
		return " ids"
	}
	return ""
}

// formRank orders plain, ids, ids+props.
func (p Point) formRank() int {
	switch {
	case p.IDs && p.Props:
		return 2
	case p.IDs:
		return 1
	}
	return 0
}

// formCell is formText for a table: plain, ids or ids+props.
func (p Point) formCell() string {
	if p.IDs {
		return strings.TrimSpace(p.formText())
	}
	return "plain"
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
		return fmt.Sprintf("backlog N=%s due=%s instances=%d shards=%d batch=%d size=%d%s",
			thousands(p.Backlog), thousands(p.Window), p.Instances, p.Shards, p.Batch, p.Size, p.formText())
	case modeRate:
		return fmt.Sprintf("rate %s/s%s instances=%d shards=%d batch=%d size=%d%s",
			thousands(p.Rate), p.queuesText(), p.Instances, p.Shards, p.Batch, p.Size, p.formText())
	case modeIngress:
		if p.Drain {
			return fmt.Sprintf("ingress drain N=%s instances=%d shards=%d batch=%d size=%d",
				thousands(p.Backlog), p.Instances, p.Shards, p.Batch, p.Size)
		}
		if p.Rate == 0 {
			return fmt.Sprintf("ingress max N=%s instances=%d shards=%d batch=%d size=%d",
				thousands(p.Backlog), p.Instances, p.Shards, p.Batch, p.Size)
		}
		return fmt.Sprintf("ingress %s/s instances=%d shards=%d batch=%d size=%d",
			thousands(p.Rate), p.Instances, p.Shards, p.Batch, p.Size)
	case modeScale:
		return fmt.Sprintf("scale%s instances=%d shards=%d batch=%d size=%d%s",
			p.queuesText(), p.Instances, p.Shards, p.Batch, p.Size, p.formText())
	case modeMemory:
		return fmt.Sprintf("memory N=%s shards=%d size=%d%s", thousands(p.Backlog), p.Shards, p.Size, p.formText())
	case modeBurst:
		return fmt.Sprintf("burst N=%s due at once instances=%d shards=%d batch=%d size=%d%s%s",
			thousands(p.Backlog), p.Instances, p.Shards, p.Batch, p.Size, p.maxRateText(), p.formText())
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
			dims = [][]int{o.Backlogs, o.Instances, o.Shards, o.Batches, o.Sizes, idsOf(o.IDs)}
		case modeRate:
			dims = [][]int{o.Rates, o.Instances, o.Shards, o.Batches, o.Sizes, queuesOr1(o.Queues), idsOf(o.IDs)}
		case modeIdle:
			dims = [][]int{o.Instances, o.Shards, queuesOr1(o.Queues)}
		case modeScale:
			dims = [][]int{o.Instances, o.Shards, o.Batches, o.Sizes, queuesOr1(o.Queues), idsOf(o.IDs)}
		case modeIngress:
			// Rate 0 is the max-ingest point, -1 the drain; tasks always
			// have an id.
			rates := slices.Clone(o.Rates)
			if o.IngressMax > 0 {
				rates = append(rates, 0)
				if o.IngressDrain {
					rates = append(rates, -1)
				}
			}
			dims = [][]int{rates, o.Instances, o.Shards, o.Batches, o.Sizes, {1}}
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
			case modeScale:
				p.Instances, p.Shards, p.Batch, p.Size, p.Queues = c[0], c[1], c[2], c[3], c[4]
			case modeIngress:
				p.Rate, p.Instances, p.Shards, p.Batch, p.Size = c[0], c[1], c[2], c[3], c[4]
				if p.Rate <= 0 {
					p.Rate, p.Backlog, p.Drain = 0, o.IngressMax, p.Rate < 0
				}
			case modeIdle:
				p.Instances, p.Shards, p.Queues = c[0], c[1], c[2]
				p.Backlog, p.Batch, p.Size = o.IdleTasks, o.Batches[0], o.Sizes[0]
			}
			if mode != modeIdle {
				p.IDs = c[len(c)-1] == 1
				p.Props = p.IDs && o.Props && mode != modeIngress
			}
			out = append(out, p)
		}
	}
	return out
}

// idsOf is the -ids list as a dimension of the plan: 0 plain, 1 ids.
func idsOf(ids []bool) []int {
	if len(ids) == 0 {
		return []int{0}
	}
	out := make([]int, len(ids))
	for i, v := range ids {
		if v {
			out[i] = 1
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
