package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// writeTables prints the results as markdown tables, ready for a README.
func writeTables(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "Machine: %s\n\n", rep.Machine)
	fmt.Fprintf(w, "Command: `%s`\n", rep.Command)

	if len(rep.Ceilings) > 0 {
		fmt.Fprintf(w, "\nCeiling: raw confirmed publishes (persistent, mandatory, %s queue, one channel, up to a window of unconfirmed ones), consumer running\n\n",
			rep.Options.QueueType)
		table(w, []string{"size B", "messages", "window", "received/s", "confirmed/s", "latency p50 ms", "p99 ms"}, func(add func(...string)) {
			for _, c := range rep.Ceilings {
				for _, t := range c.Tried {
					add(itoa(c.Size), thousands(t.Messages), itoa(t.Window), thousands(int(t.PerSec)), thousands(int(t.ConfirmedPerSec)),
						fmtMs(t.Latency.P50), fmtMs(t.Latency.P99))
				}
			}
		})
	}
	if rs := results(rep, modeBacklog); len(rs) > 0 {
		fmt.Fprintf(w, "\nBacklog: N tasks pending, W of them due, when the dispatchers start; throughput over the W (first to last receipt)\n\n")
		table(w, []string{"pending N", "due W", "instances", "shards", "batch", "size B", "tasks/s", "ceiling/s", "ratio",
			"lateness p50 ms", "p99 ms", "p99.9 ms", "max ms", "worst shard p99 ms", "Redis cmds/task", "scripts/task",
			"CPU s/10k tasks", "peak RSS MB", "dups", "missing"}, func(add func(...string)) {
			for _, r := range rs {
				add(thousands(r.Backlog), thousands(r.Window), itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size),
					thousands(int(r.PerSec)), thousands(int(r.Ceiling)), fmt.Sprintf("%.2f", r.Ratio),
					fmtMs(r.Lateness.P50), fmtMs(r.Lateness.P99), fmtMs(r.Lateness.P999), fmtMs(r.Lateness.Max),
					fmtMs(r.ShardP99Worst), fmt.Sprintf("%.2f", r.CmdsPerTask), fmt.Sprintf("%.3f", r.ScriptsPerTask),
					fmt.Sprintf("%.2f", r.CPUPer10k), fmt.Sprintf("%.0f", r.PeakRSSMB), thousands(int(r.Duplicates)), thousands(r.Missing))
			}
		})
	}
	if rs := results(rep, modeRate); len(rs) > 0 {
		fmt.Fprintf(w, "\nSteady rate: each task ZADDed 1 s before its due time, no notification; lateness = consumer receipt minus due time\n\n")
		table(w, []string{"rate/s", "instances", "shards", "batch", "size B", "tasks", "lateness p50 ms", "p99 ms", "p99.9 ms",
			"max ms", "median shard p99 ms", "worst shard p99 ms", "Redis cmds/task", "CPU s/10k tasks", "peak RSS MB",
			"dups", "missing"}, func(add func(...string)) {
			for _, r := range rs {
				add(thousands(r.Rate), itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size), thousands(r.Delivered),
					fmtMs(r.Lateness.P50), fmtMs(r.Lateness.P99), fmtMs(r.Lateness.P999), fmtMs(r.Lateness.Max),
					fmtMs(r.ShardP99Median), fmtMs(r.ShardP99Worst), fmt.Sprintf("%.2f", r.CmdsPerTask),
					fmt.Sprintf("%.2f", r.CPUPer10k), fmt.Sprintf("%.0f", r.PeakRSSMB), thousands(int(r.Duplicates)), thousands(r.Missing))
			}
		})
	}
	if len(rep.Idle) > 0 {
		fmt.Fprintf(w, "\nIdle: nothing due; Redis commands (those inside scripts included) per second; the background row is Redis with no instance running\n\n")
		table(w, []string{"instances", "shards", "pending", "Redis cmds/s", "per instance", "script calls/s", "CPU % per instance"},
			func(add func(...string)) {
				for _, r := range rep.Idle {
					if r.Instances == 0 {
						add("0 (background)", itoa(r.Shards), thousands(r.Backlog), fmt.Sprintf("%.0f", r.CmdsPerSec), "", fmt.Sprintf("%.0f", r.ScriptsPerSec), "")
						continue
					}
					add(itoa(r.Instances), itoa(r.Shards), thousands(r.Backlog), fmt.Sprintf("%.0f", r.CmdsPerSec),
						fmt.Sprintf("%.0f", r.CmdsPerSecPerInstance), fmt.Sprintf("%.0f", r.ScriptsPerSec), fmt.Sprintf("%.2f", r.CPUPercent))
				}
			})
	}
	if perPrimary(rep) {
		fmt.Fprintf(w, "\nRedis per primary: each primary's share of the Redis figures above (shards: the point's shards it holds)\n\n")
		table(w, []string{"point", "primary", "shards", "Redis cmds", "cmds/task", "cmds/s", "script calls", "other clients"},
			func(add func(...string)) {
				row := func(p Point, u RedisUse) {
					for _, pu := range u.Primaries {
						perTask := ""
						if pu.CmdsPerTask > 0 {
							perTask = fmt.Sprintf("%.2f", pu.CmdsPerTask)
						}
						add(p.String(), pu.Addr, itoa(pu.Shards), thousands(int(pu.Commands)), perTask,
							fmt.Sprintf("%.0f", pu.CmdsPerSec), thousands(int(pu.ScriptCalls)), itoa(pu.OtherClients))
					}
				}
				for _, mode := range []string{modeBacklog, modeRate} {
					for _, r := range results(rep, mode) {
						row(r.Point, r.Redis)
					}
				}
				for _, r := range rep.Idle {
					row(r.Point, r.Redis)
				}
			})
	}
	others := 0
	for _, r := range rep.Results {
		others = max(others, r.Redis.OtherClients)
	}
	for _, r := range rep.Idle {
		others = max(others, r.Redis.OtherClients)
	}
	if others > 0 {
		fmt.Fprintf(w, "\nNote: up to %d other Redis clients sent commands during the measurements; the Redis figures include them.\n", others)
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintf(w, "\nFAILED:\n")
		for _, f := range rep.Failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
	}
}

// perPrimary says whether Redis had more than one primary (a cluster):
// then the figures are also given per primary.
func perPrimary(rep *Report) bool {
	for _, r := range rep.Results {
		if len(r.Redis.Primaries) > 1 {
			return true
		}
	}
	for _, r := range rep.Idle {
		if len(r.Redis.Primaries) > 1 {
			return true
		}
	}
	return false
}

// results returns the mode's results ordered for reading: by instances,
// shards, batch, size, then backlog or rate (the JSON keeps run order).
func results(rep *Report, mode string) []*Result {
	var out []*Result
	for _, r := range rep.Results {
		if r.Mode == mode {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b *Result) int {
		return cmp.Or(cmp.Compare(a.Instances, b.Instances), cmp.Compare(a.Shards, b.Shards), cmp.Compare(a.Batch, b.Batch),
			cmp.Compare(a.Size, b.Size), cmp.Compare(a.Backlog, b.Backlog), cmp.Compare(a.Rate, b.Rate))
	})
	return out
}

// table writes a markdown table; numbers are right-aligned.
func table(w io.Writer, head []string, rows func(add func(...string))) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(head, " | "))
	seps := make([]string, len(head))
	for i := range seps {
		seps[i] = "---:"
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(seps, " | "))
	rows(func(cells ...string) { fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | ")) })
}

func itoa(n int) string { return fmt.Sprint(n) }

// fmtMs writes milliseconds with about three significant digits.
func fmtMs(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return thousands(int(v + 0.5))
	}
}

func writeJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}
