package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// writeTables prints the results as markdown tables, ready for a README.
func writeTables(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "Machine: %s\n\n", rep.Machine)
	fmt.Fprintf(w, "Command: `%s`\n\n", rep.Command)
	fmt.Fprintf(w, "Consumer: %s\n", rep.Consumer)
	if rep.CPUCap != nil {
		fmt.Fprintf(w, "\nCPU cap: %s\n", rep.CPUCap)
	}
	switch {
	case len(rep.Results) == 0:
	case rep.DispatcherStamps:
		fmt.Fprintf(w, "\nLateness, two views: dispatch = header x-published-us (when the dispatcher began publishing the task's batch, Redis clock) minus due time; consumer = receipt minus due time. Cells: p50 / p99 / p99.9 / max, ms.\n")
	default:
		fmt.Fprintf(w, "\nLateness, two views: dispatch = header x-published-us minus due time, not measured (\"-\"): this dispatcher does not know %s; consumer = receipt minus due time. Cells: p50 / p99 / p99.9 / max, ms.\n", stampVar)
	}
	consumer := ""
	if rep.Options != nil {
		consumer = "; consumer: " + rep.Options.consumerShort()
	}

	if len(rep.Ceilings) > 0 {
		fmt.Fprintf(w, "\nCeiling: raw confirmed publishes (persistent, mandatory, %s queue, one channel, up to a window of unconfirmed ones), consumer running%s\n\n",
			rep.Options.QueueType, consumer)
		table(w, []string{"size B", "form", "messages", "window", "received/s", "confirmed/s", "latency p50 ms", "p99 ms"}, func(add func(...string)) {
			for _, c := range rep.Ceilings {
				for _, t := range c.Tried {
					add(itoa(c.Size), c.form().formCell(), thousands(t.Messages), itoa(t.Window), thousands(int(t.PerSec)), thousands(int(t.ConfirmedPerSec)),
						fmtMs(t.Latency.P50), fmtMs(t.Latency.P99))
				}
			}
		})
	}
	if rs := results(rep, modeBacklog); len(rs) > 0 {
		fmt.Fprintf(w, "\nBacklog: N tasks pending, W of them due, when the dispatchers start; throughput over the W (first to last receipt)%s\n\n", consumer)
		table(w, []string{"pending N", "due W", "instances", "shards", "batch", "size B", "form", "tasks/s", "ceiling/s", "ratio",
			"dispatch p50 / p99 / p99.9 / max ms", "consumer p50 / p99 / p99.9 / max ms", "worst shard p99 ms (consumer)",
			"Redis cmds/task", "scripts/task", "CPU s/10k tasks", "Redis CPU s/10k tasks", "peak RSS MB", "dups", "missing"},
			func(add func(...string)) {
				for _, r := range rs {
					add(thousands(r.Backlog), thousands(r.Window), itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size),
						r.formCell(), thousands(int(r.PerSec)), thousands(int(r.Ceiling)), fmt.Sprintf("%.2f", r.Ratio),
						latCell(r.DispatchLateness), latCell(&r.Lateness),
						fmtMs(r.ShardP99Worst), fmt.Sprintf("%.2f", r.CmdsPerTask), fmt.Sprintf("%.3f", r.ScriptsPerTask),
						fmt.Sprintf("%.2f", r.CPUPer10k), fmtOpt(r.RedisCPUPer10k, "%.2f"), fmt.Sprintf("%.0f", r.PeakRSSMB),
						thousands(int(r.Duplicates)), thousands(r.Missing))
				}
			})
	}
	if rs := results(rep, modeRate); len(rs) > 0 {
		ahead, wake := "1 s", "no notification"
		if o := rep.Options; o != nil {
			ahead = time.Duration(o.Ahead).String()
			if o.Wake {
				wake = "then a wake-up PUBLISH"
			}
		}
		fmt.Fprintf(w, "\nSteady rate: each task ZADDed %s before its due time, %s; \"first 1 s\": the tasks due in the first second from the earliest due time (the start of traffic)%s\n\n", ahead, wake, consumer)
		table(w, []string{"rate/s", "queues", "instances", "shards", "batch", "size B", "form", "tasks due", "tasks", "dispatch p50 / p99 / p99.9 / max ms",
			"consumer p50 / p99 / p99.9 / max ms", "median shard p99 ms (consumer)", "worst shard p99 ms (consumer)", "Redis cmds/task",
			"CPU s/10k tasks", "Redis CPU s/10k tasks", "peak RSS MB", "dups", "missing"}, func(add func(...string)) {
			for _, r := range rs {
				add(thousands(r.Rate), itoa(max(r.Queues, 1)), itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size), r.formCell(), "whole run", thousands(r.Delivered),
					latCell(r.DispatchLateness), latCell(&r.Lateness),
					fmtMs(r.ShardP99Median), fmtMs(r.ShardP99Worst), fmt.Sprintf("%.2f", r.CmdsPerTask),
					fmt.Sprintf("%.2f", r.CPUPer10k), fmtOpt(r.RedisCPUPer10k, "%.2f"), fmt.Sprintf("%.0f", r.PeakRSSMB),
					thousands(int(r.Duplicates)), thousands(r.Missing))
				if f := r.FirstSecond; f != nil {
					add(thousands(r.Rate), itoa(max(r.Queues, 1)), itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size), r.formCell(), "first 1 s", thousands(f.Tasks),
						latCell(f.DispatchLateness), latCell(&f.Lateness), "", "", "", "", "", "", "", "")
				}
			}
		})
	}
	if rs := results(rep, modeIngress); len(rs) > 0 {
		writeIngress(w, rs, consumer)
	}
	if len(rep.Scale) > 0 {
		writeScale(w, rep, consumer)
	}
	writeInstances(w, rep)
	writeFloors(w, rep)
	if rs := results(rep, modeBurst); len(rs) > 0 {
		fmt.Fprintf(w, "\nBurst: N tasks due at one time, the instances running when it comes; drain from the due time to the last receipt; meanwhile a producer ZADDs one task every %s (one round trip each) and `stats` is read every %s on the same Redis; Redis calls that held it over %d ms (SLOWLOG, script calls counted once)%s\n\n",
			zaddEvery, statsEvery, slowThresholdUs/1000, consumer)
		table(w, []string{"due N", "instances", "shards", "batch", "size B", "form", "max rate", "drained s", "tasks/s", "ceiling/s", "ratio", "busiest s",
			"ZADD p50 / p99 / max ms", "ZADD before p50 / p99 / max ms", "stats p50 / p99 / max ms", "calls > 1 ms", "longest ms", "missing", "dups"},
			func(add func(...string)) {
				for _, r := range rs {
					b := r.Burst
					if b == nil {
						continue
					}
					rate, slow, longest := "none", itoa(b.Slow), fmt.Sprintf("%.1f", b.SlowMaxMs)
					if b.MaxRate > 0 {
						rate = thousands(b.MaxRate) + "/s"
					}
					if b.SlowNote != "" {
						slow, longest = "-", "-"
					}
					add(thousands(r.Backlog), itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size), r.formCell(), rate,
						fmt.Sprintf("%.1f", b.DrainSeconds), thousands(int(b.DrainPerSec)), thousands(int(r.Ceiling)), fmt.Sprintf("%.2f", r.Ratio),
						thousands(slices.Max(append([]int{0}, b.PerSecond...))), probeCell(b.Producer), probeCell(b.Before), probeCell(b.Stats),
						slow, longest, thousands(r.Missing), thousands(int(r.Duplicates)))
				}
			})
	}
	if len(rep.Memory) > 0 {
		fmt.Fprintf(w, "\nMemory: Redis used_memory growth (every primary) per pending task, tasks due in an hour, no instance running\n\n")
		table(w, []string{"tasks", "shards", "member B", "form", "bytes/task", "beyond the member", "tasks in 16 GiB", "fragmentation", "loaded/s"},
			func(add func(...string)) {
				for _, r := range rep.Memory {
					add(thousands(r.Backlog), itoa(r.Shards), itoa(r.Size), r.formCell(), fmt.Sprintf("%.0f", r.PerTask), fmt.Sprintf("%.0f", r.PerTaskOverhead),
						thousands(int(r.In16GB)), fmt.Sprintf("%.2f", r.Fragmentation), thousands(int(r.LoadedPerSec)))
				}
			})
	}
	if len(rep.Idle) > 0 {
		fmt.Fprintf(w, "\nIdle: nothing due; Redis commands (those inside scripts included) per second, Redis CPU (INFO cpu) as %% of one core; the background row is Redis with no instance running\n\n")
		table(w, []string{"instances", "queues", "shards", "pending", "Redis cmds/s", "per instance", "script calls/s", "Redis CPU %",
			"CPU % per instance"},
			func(add func(...string)) {
				for _, r := range rep.Idle {
					if r.Instances == 0 {
						add("0 (background)", "", itoa(r.Shards), thousands(r.Backlog), fmt.Sprintf("%.0f", r.CmdsPerSec), "",
							fmt.Sprintf("%.0f", r.ScriptsPerSec), fmtPct(r.RedisCPUPercent), "")
						continue
					}
					add(itoa(r.Instances), itoa(max(r.Queues, 1)), itoa(r.Shards), thousands(r.Backlog), fmt.Sprintf("%.0f", r.CmdsPerSec),
						fmt.Sprintf("%.0f", r.CmdsPerSecPerInstance), fmt.Sprintf("%.0f", r.ScriptsPerSec), fmtPct(r.RedisCPUPercent),
						fmt.Sprintf("%.2f", r.CPUPercent))
				}
			})
	}
	if perPrimary(rep) {
		fmt.Fprintf(w, "\nRedis per primary: each primary's share of the Redis figures above (shards: the point's shards it holds)\n\n")
		table(w, []string{"point", "primary", "shards", "Redis cmds", "cmds/task", "cmds/s", "script calls", "CPU s", "CPU %", "other clients"},
			func(add func(...string)) {
				row := func(p Point, u RedisUse) {
					for _, pu := range u.Primaries {
						perTask := ""
						if pu.CmdsPerTask > 0 {
							perTask = fmt.Sprintf("%.2f", pu.CmdsPerTask)
						}
						add(p.String(), pu.Addr, itoa(pu.Shards), thousands(int(pu.Commands)), perTask,
							fmt.Sprintf("%.0f", pu.CmdsPerSec), thousands(int(pu.ScriptCalls)), fmtOpt(pu.CPUSeconds, "%.2f"),
							fmtPct(pu.CPUPercent), itoa(pu.OtherClients))
					}
				}
				for _, mode := range []string{modeBacklog, modeRate, modeIngress, modeBurst} {
					for _, r := range results(rep, mode) {
						row(r.Point, r.Redis)
					}
				}
				for _, r := range rep.Idle {
					row(r.Point, r.Redis)
				}
			})
	}
	others, redisMeasured, unstamped := 0, false, false
	for _, r := range rep.Results {
		others = max(others, r.Redis.OtherClients)
		redisMeasured = true
		unstamped = unstamped || (r.DispatchLateness != nil && r.Unstamped > 0)
	}
	for _, r := range rep.Idle {
		others = max(others, r.Redis.OtherClients)
		redisMeasured = true
	}
	var otherConns int64
	for _, r := range rep.Memory {
		others = max(others, r.OtherClients)
		otherConns = max(otherConns, r.OtherConnections)
	}
	if redisMeasured {
		fmt.Fprintf(w, "\nNote: Redis CPU is everything the Redis server did in the measured window (INFO cpu, used_cpu_sys + used_cpu_user, summed over every primary): other clients' work, the bench's own INFO calls and, in rate mode, its ZADDs included.\n")
	}
	if others > 0 {
		fmt.Fprintf(w, "\nNote: up to %d other Redis clients sent commands during the measurements; the Redis figures (commands, CPU, memory growth) include them.\n", others)
	}
	if otherConns > 0 {
		fmt.Fprintf(w, "\nNote: Redis took up to %d connections of other clients while a memory point loaded; what they wrote or freed is in its growth.\n", otherConns)
	}
	if unstamped {
		fmt.Fprintf(w, "\nNote: some tasks arrived without x-published-us; the dispatch view covers the others only:")
		for _, r := range rep.Results {
			if r.DispatchLateness != nil && r.Unstamped > 0 {
				fmt.Fprintf(w, " %s: %s of %s unstamped;", r.Point, thousands(int(r.Unstamped)), thousands(r.Delivered))
			}
		}
		fmt.Fprintln(w)
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintf(w, "\nFAILED:\n")
		for _, f := range rep.Failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
	}
}

// latCell is one lateness view's cell: p50 / p99 / p99.9 / max in ms, or
// "-" for a view not measured.
func latCell(d *Dist) string {
	if d == nil || d.Count == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s / %s", fmtMs(d.P50), fmtMs(d.P99), fmtMs(d.P999), fmtMs(d.Max))
}

// latShort is latCell's p50 / p99 / max, for progress lines.
func latShort(d *Dist) string {
	if d == nil || d.Count == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s", fmtMs(d.P50), fmtMs(d.P99), fmtMs(d.Max))
}

// fmtOpt formats a figure that may be unknown ("-").
func fmtOpt(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

// fmtPct formats a percentage that may be unknown.
func fmtPct(v *float64) string { return fmtOpt(v, "%.2f") }

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
// shards, batch, size, then backlog or rate, then queues (the JSON keeps
// run order).
func results(rep *Report, mode string) []*Result {
	var out []*Result
	for _, r := range rep.Results {
		if r.Mode == mode {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b *Result) int {
		return cmp.Or(cmp.Compare(a.Instances, b.Instances), cmp.Compare(a.Shards, b.Shards), cmp.Compare(a.Batch, b.Batch),
			cmp.Compare(a.Size, b.Size), cmp.Compare(a.Backlog, b.Backlog), cmp.Compare(a.Rate, b.Rate), cmp.Compare(max(a.Queues, 1), max(b.Queues, 1)),
			cmp.Compare(a.formRank(), b.formRank()))
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
	if err := writeFile(path, append(b, '\n')); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// writeFile replaces path with data whole or not at all: it writes a
// temporary file beside it and renames it over path.
func writeFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// probeCell is "p50 / p99 / max" of a probe, in ms.
func probeCell(p Probe) string {
	if p.Count == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f / %.2f / %.2f", p.P50, p.P99, p.Max)
}

// writeScale is scale mode's table: per instance count, the highest rate
// that held and how, then every step.
func writeScale(w io.Writer, rep *Report, consumer string) {
	s0 := rep.Scale[0]
	capText := "no CPU cap"
	if rep.CPUCap != nil {
		capText = fmt.Sprintf("each instance capped at %.3g of a core", rep.CPUCap.Cores)
	}
	fmt.Fprintf(w, "\nScale: the highest steady rate whose %s lateness p99 (tasks due after the first second of each %.0f s step) stayed within %s ms; %s; shares: tasks each instance dispatched; CPU: %% of one core from ready to the end of the step%s\n\n",
		s0.View, s0.StepSeconds, fmtMs(s0.TargetP99Ms), capText, consumer)
	table(w, []string{"instances", "queues", "shards", "batch", "size B", "form", "highest rate/s", "p99 ms", "dispatch p50 / p99 / p99.9 / max ms",
		"consumer p50 / p99 / p99.9 / max ms", "share % each", "CPU % each", "throttled periods % each", "CPU s/10k tasks", "steps: rate/s p99 ms"},
		func(add func(...string)) {
			for _, sr := range rep.Scale {
				var steps []string
				for _, st := range sr.Steps {
					mark := "held"
					if !st.Held {
						mark = "failed"
						if st.Result != nil && st.Result.Abandoned > 0 {
							mark = "overloaded"
						}
					}
					steps = append(steps, fmt.Sprintf("%s: %s %s", thousands(st.Rate), fmtMs(st.P99Ms), mark))
				}
				cells := []string{itoa(sr.Instances), itoa(max(sr.Queues, 1)), itoa(sr.Shards), itoa(sr.Batch), itoa(sr.Size), sr.formCell()}
				if sr.BestStep < 0 {
					cells = append(cells, "none", "", "", "", "", "", "", "")
				} else {
					st := sr.Steps[sr.BestStep]
					b := st.Result
					var disp *Dist
					cons := &Dist{}
					if a := b.AfterFirstSecond; a != nil {
						disp, cons = a.DispatchLateness, &a.Lateness
					}
					cells = append(cells, thousands(sr.BestRate), fmtMs(st.P99Ms), latCell(disp), latCell(cons),
						joinFloats(b.SharePercentEach, "%.0f"), joinFloats(b.CPUPercentEach, "%.1f"), throttledCell(b.ThrottleEach),
						fmt.Sprintf("%.2f", b.CPUPer10k))
				}
				add(append(cells, strings.Join(steps, "; "))...)
			}
		})
}

// throttledCell is the % of CFS periods in which each instance used up
// its quota and was held; "-" without a cap.
func throttledCell(ts []Throttle) string {
	if len(ts) == 0 {
		return "-"
	}
	vs := make([]float64, len(ts))
	for i, t := range ts {
		if t.Periods > 0 {
			vs[i] = 100 * float64(t.Throttled) / float64(t.Periods)
		}
	}
	return joinFloats(vs, "%.0f")
}

// writeInstances is each instance's share and CPU at the rate points and
// at scale mode's highest rates that held.
func writeInstances(w io.Writer, rep *Report) {
	type row struct {
		what string
		r    *Result
	}
	var rows []row
	for _, r := range results(rep, modeRate) {
		rows = append(rows, row{r.Point.String(), r})
	}
	for _, sr := range rep.Scale {
		if sr.BestStep >= 0 {
			rows = append(rows, row{"scale: " + sr.Steps[sr.BestStep].Result.Point.String(), sr.Steps[sr.BestStep].Result})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nInstances: each one's tasks dispatched (dispatcher_tasks_dispatched_total) and CPU (utime+stime from ready to the end, as %% of one core over that window); throttled: CFS periods in which the cap held it\n\n")
	table(w, []string{"point", "instance", "tasks", "share %", "publish calls", "CPU s", "CPU % of a core", "throttled periods", "throttled s"},
		func(add func(...string)) {
			for _, rw := range rows {
				r := rw.r
				for i := range r.DispatchedEach {
					cpu, pct, thr, thrS := "", "", "-", "-"
					if i < len(r.CPUSecondsEach) {
						cpu = fmt.Sprintf("%.2f", r.CPUSecondsEach[i])
					}
					if i < len(r.CPUPercentEach) {
						pct = fmt.Sprintf("%.1f", r.CPUPercentEach[i])
					}
					if i < len(r.ThrottleEach) {
						t := r.ThrottleEach[i]
						thr = fmt.Sprintf("%s of %s", thousands(int(t.Throttled)), thousands(int(t.Periods)))
						thrS = fmt.Sprintf("%.2f", t.ThrottledSeconds)
					}
					calls := ""
					if i == 0 {
						calls = thousands(int(r.PublishCalls)) + " (all)"
					}
					add(rw.what, itoa(i), thousands(int(r.DispatchedEach[i])), fmt.Sprintf("%.1f", r.SharePercentEach[i]), calls, cpu, pct, thr, thrS)
				}
			}
		})
}

// writeFloors is the floor of every point that measured it.
func writeFloors(w io.Writer, rep *Report) {
	type row struct {
		what string
		f    *Floor
	}
	var rows []row
	for _, r := range results(rep, modeRate) {
		if r.Floor != nil {
			rows = append(rows, row{r.Point.String(), r.Floor})
		}
	}
	for _, sr := range rep.Scale {
		if sr.Floor != nil {
			rows = append(rows, row{"scale: " + sr.Steps[sr.BestStep].Result.Point.String(), sr.Floor})
		}
	}
	if len(rows) == 0 {
		return
	}
	capped := ""
	if rep.CPUCap != nil {
		capped = ", capped as the instances were"
	}
	fmt.Fprintf(w, "\nFloor: amqp091-go alone (one connection, one confirm-mode channel, a process of its own%s) publishing at the instances' cadence (their publish calls/s and tasks/s), persistent, mandatory, to the point's kind of exchange and consumer; its CPU (/proc utime+stime, first publish to last confirm) per 10,000 messages against the instances' per 10,000 tasks (from ready to the end). Where the instances or the floor use up their CPU cap, the figures say what the cap allowed, not what the work needed\n\n", capped)
	table(w, []string{"point", "calls/s", "messages/s", "messages/call", "messages", "floor CPU s/10k", "dispatcher CPU s/10k", "dispatcher / floor",
		"floor CPU % of a core", "floor throttled periods %", "floor latency p50 / p99 ms", "calls from"},
		func(add func(...string)) {
			for _, rw := range rows {
				f := rw.f
				ratio := "-"
				if f.Ratio > 0 {
					ratio = fmt.Sprintf("%.1f×", f.Ratio)
				}
				add(rw.what, thousands(int(f.CallsPerSec+0.5)), thousands(int(f.MsgsPerSec+0.5)), fmt.Sprintf("%.1f", f.MsgsPerSec/max(f.CallsPerSec, 1e-9)),
					thousands(int(f.Messages)), fmt.Sprintf("%.3f", f.CPUPer10k), fmt.Sprintf("%.3f", f.DispatcherCPUPer10k), ratio,
					fmt.Sprintf("%.1f", 100*f.CPUSeconds/max(f.Seconds, 1e-9)), throttledCell(throttleOf(f)),
					fmt.Sprintf("%s / %s", fmtMs(f.Latency.P50), fmtMs(f.Latency.P99)), f.CallsFrom)
			}
		})
}

func throttleOf(f *Floor) []Throttle {
	if f.Throttle == nil {
		return nil
	}
	return []Throttle{*f.Throttle}
}

// writeIngress is ingress mode's table.
func writeIngress(w io.Writer, rs []*Result, consumer string) {
	delay, window := "-", 0
	for _, r := range rs {
		if r.Ingress != nil {
			delay = time.Duration(r.Ingress.DelayMs * int64(time.Millisecond)).String()
			window = r.Ingress.Window
		}
	}
	fmt.Fprintf(w, "\nIngress: messages published to the queue's ingress exchange with x-delay %s, as to the delayed-message plugin (one confirm-mode channel, persistent, mandatory, message_id set), paced at the rate or (max) as fast as the broker confirms them with up to %s unconfirmed, or (drain) all of them so before the instances start; the instances write each to Redis as a task with an id and publish it at its due time. ingest/s: tasks written to Redis per second, first to last ingest (the Redis clock reading before each batch's write); to Redis: publish to the task seen in Redis by a poll every 1 ms of one message in k; to ingest: publish to that clock reading, every message; lateness, Redis and CPU figures as in rate mode, for ingest and dispatch together%s\n\n",
		delay, thousands(window), consumer)
	table(w, []string{"point", "instances", "shards", "batch", "size B", "ingress queue", "prefetch", "messages", "published/s", "ingest/s", "ceiling/s", "ingest / ceiling",
		"to Redis p50 / p99 / max ms", "1 in k", "to ingest p50 / p99 / max ms", "dispatch p50 / p99 / p99.9 / max ms", "consumer p50 / p99 / p99.9 / max ms",
		"Redis cmds/task", "CPU s/10k tasks", "Redis CPU s/10k tasks", "dups", "missing"},
		func(add func(...string)) {
			for _, r := range rs {
				g := r.Ingress
				if g == nil {
					continue
				}
				point, k := thousands(r.Rate)+"/s", itoa(g.SampleEvery)
				if g.Max {
					point, k = "max", "-"
				}
				if g.Drain {
					point = "drain"
				}
				ingest, ratio := "-", "-"
				if g.IngestPerSec > 0 {
					ingest, ratio = thousands(int(g.IngestPerSec)), fmt.Sprintf("%.2f", r.Ratio)
				}
				add(point, itoa(r.Instances), itoa(r.Shards), itoa(r.Batch), itoa(r.Size), g.QueueType, itoa(g.Prefetch), thousands(g.Published),
					thousands(int(g.PublishPerSec)), ingest, thousands(int(r.Ceiling)), ratio,
					latShort(g.ToRedis), k, latShort(g.ToIngest), latCell(r.DispatchLateness), latCell(&r.Lateness),
					fmt.Sprintf("%.2f", r.CmdsPerTask), fmt.Sprintf("%.2f", r.CPUPer10k), fmtOpt(r.RedisCPUPer10k, "%.2f"),
					thousands(int(r.Duplicates)), thousands(r.Missing))
			}
		})
	var notes []string
	for _, r := range rs {
		g := r.Ingress
		if g == nil {
			continue
		}
		if g.Unseen > 0 || g.PollErrors > 0 {
			notes = append(notes, fmt.Sprintf("%s: the poll never found %d of the messages it followed (claimed first, or the run ended); %d polls failed", r.Point, g.Unseen, g.PollErrors))
		}
		if g.BrokerStamped > 0 {
			notes = append(notes, fmt.Sprintf("%s: %s deliveries carried timestamp_in_ms (the broker's receipt time, which the ingress takes as the base of the due time): ingest/s and to ingest not measured", r.Point, thousands(int(g.BrokerStamped))))
		}
	}
	for _, n := range notes {
		fmt.Fprintf(w, "\nNote: %s.\n", n)
	}
}
