package bench

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A tiny scale run with every instance capped at a tenth of a core, after
// a rate point with its floor: the cap is in force (read back, the kernel
// held the instances), each step and each instance count are reported
// with every instance's share and CPU, the floor published at the
// instances' cadence, and no cgroup, key, queue or exchange is left. The
// lateness target is loose (1 s), so that the steps hold on a busy
// machine and the scale mode's floor runs; whether they hold is not
// judged here, only that the verdicts follow the figures.
func TestBenchScaleCapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("-cpu-cap makes cgroups, which needs root; running as uid %d", os.Geteuid())
	}
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	code, stdout, stderr := runBench(t,
		"-mode", "rate,scale", "-rate", "300", "-duration", "2s", "-instances", "1,2", "-shards", "4", "-size", "100",
		"-cpu-cap", "0.1", "-floor", "-scale-step", "2s", "-scale-steps", "2", "-scale-p99", "1s",
		"-queue-type", "transient", "-stall", "20s", "-json", jsonPath, "-dispatcher", binary)
	t.Logf("stdout:\n%s", stdout)
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"CPU cap: 0.1 of a core per process (cgroup v", "| instances | queues | shards | batch | size B | form | highest rate/s |",
		"| point | instance | tasks | share % |", "| point | calls/s | messages/s | messages/call |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	if !strings.Contains(stderr, "CPU s/10k, dispatcher") {
		t.Errorf("no floor line in the progress:\n%s", stderr)
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 {
		t.Errorf("failures: %q", rep.Failures)
	}
	c := rep.CPUCap
	if c == nil || c.QuotaUs != 1000 || c.PeriodUs != 10000 || c.Cores != 0.1 {
		t.Fatalf("cap in force: %+v", c)
	}
	// Every cgroup is gone.
	entries, err := os.ReadDir(c.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "dispatcher-bench-"+itoa(os.Getpid())+"-") {
			t.Errorf("cgroup %s left", e.Name())
		}
	}

	// The rate point (instances 1, then 2: the lists are swept one at a
	// time) and its floor.
	rates := results(&rep, modeRate)
	if len(rates) != 2 {
		t.Fatalf("%d rate results", len(rates))
	}
	names := []string{}
	for _, r := range rates {
		checkResult(t, r, 600)
		checkInstances(t, r)
		f := r.Floor
		if f == nil {
			t.Fatalf("%s: no floor", r.Point)
		}
		names = append(names, r.Name, f.Name)
		calls, msgs := floorCounts(reportedCadence(r), 2e9)
		if f.CallsFrom != metricCalls || int(f.Calls) != calls || int(f.Messages) != msgs || f.Confirmed != f.Messages ||
			f.Received != msgs || f.Missing != 0 || f.Nacked != 0 || f.Returned != 0 || f.Latency.Count != msgs {
			t.Errorf("%s: floor %+v; want %d calls of %d messages", r.Point, f, calls, msgs)
		}
		if f.CPUPer10k <= 0 || f.LifeCPUSeconds < f.CPUSeconds || f.Throttle == nil || f.Ratio <= 0 ||
			math.Abs(f.Ratio-r.CPUPer10k/f.CPUPer10k) > 1e-9 || f.DispatcherCPUPer10k != r.CPUPer10k {
			t.Errorf("%s: floor CPU %+v; instances %.3f s/10k", r.Point, f, r.CPUPer10k)
		}
	}

	if len(rep.Scale) != 2 || rep.Scale[0].Instances != 1 || rep.Scale[1].Instances != 2 {
		t.Fatalf("scale results: %+v", rep.Scale)
	}
	for _, sr := range rep.Scale {
		if len(sr.Steps) < 1 || len(sr.Steps) > 2 || sr.TargetP99Ms != 1000 || sr.StepSeconds != 2 {
			t.Fatalf("%s: %+v", sr.Point, sr)
		}
		best := 0
		for i, st := range sr.Steps {
			r := st.Result
			names = append(names, r.Name)
			if r.Rate != st.Rate || r.Instances != sr.Instances || r.Scheduled != 2*st.Rate {
				t.Errorf("%s step %d: %s, %d scheduled", sr.Point, i, r.Point, r.Scheduled)
			}
			held, p99, why := judge(r, rep.DispatcherStamps, 1e9)
			if held != st.Held || p99 != st.P99Ms || why != st.Why {
				t.Errorf("%s step %d: verdict %v %v %q, the figures say %v %v %q", sr.Point, i, st.Held, st.P99Ms, st.Why, held, p99, why)
			}
			if st.Held {
				checkInstances(t, r)
				if st.Rate > best {
					best = st.Rate
				}
			}
		}
		if sr.BestRate != best || (best > 0) != (sr.BestStep >= 0) || (best > 0 && sr.Steps[sr.BestStep].Rate != best) {
			t.Errorf("%s: best %d (step %d), the steps say %d", sr.Point, sr.BestRate, sr.BestStep, best)
		}
		if (sr.Floor != nil) != (best > 0) {
			t.Errorf("%s: floor %+v with best rate %d", sr.Point, sr.Floor, best)
		}
		if sr.Floor != nil {
			names = append(names, sr.Floor.Name)
			if sr.Floor.Missing != 0 || sr.Floor.Confirmed != sr.Floor.Messages || sr.Floor.Ratio <= 0 {
				t.Errorf("%s: floor %+v", sr.Point, sr.Floor)
			}
		}
	}
	// The second count starts at 1.5 times the first's best, when it
	// had one.
	if b := rep.Scale[0].BestRate; b > 0 && rep.Scale[1].Steps[0].Rate != roundRate(b*3/2) {
		t.Errorf("second count starts at %d after a best of %d", rep.Scale[1].Steps[0].Rate, b)
	}
	assertCleanedUp(t, rep.RunID, names...)
}

// reportedCadence is a 2 s point's cadence as the report gives it.
func reportedCadence(r *Result) cadence {
	return cadence{callsPerSec: r.PublishCalls / 2, msgsPerSec: sum(r.DispatchedEach) / 2}
}

func sum(vs []float64) float64 {
	s := 0.0
	for _, v := range vs {
		s += v
	}
	return s
}

// checkInstances checks each instance's figures of a capped point: its
// share of the tasks (all of them between them), its CPU within the cap,
// and the kernel's throttling counted.
func checkInstances(t *testing.T, r *Result) {
	t.Helper()
	k := r.Instances
	if len(r.DispatchedEach) != k || len(r.SharePercentEach) != k || len(r.CPUPercentEach) != k || len(r.ThrottleEach) != k {
		t.Fatalf("%s: per instance %v %v %v %v", r.Point, r.DispatchedEach, r.SharePercentEach, r.CPUPercentEach, r.ThrottleEach)
	}
	if sum(r.DispatchedEach) != float64(r.Delivered) || math.Abs(sum(r.SharePercentEach)-100) > 1e-6 {
		t.Errorf("%s: dispatched %v (%v %%) of %d", r.Point, r.DispatchedEach, r.SharePercentEach, r.Delivered)
	}
	periods := int64(0)
	for i, pct := range r.CPUPercentEach {
		// A tenth of a core, give or take /proc's 10 ms ticks.
		if pct < 0 || pct > 10+100*0.02/r.CPUWindowSeconds {
			t.Errorf("%s: instance %d used %.1f%% of a core over %.1f s, capped at 10%%", r.Point, i, pct, r.CPUWindowSeconds)
		}
		periods += r.ThrottleEach[i].Periods
	}
	if periods == 0 || r.PublishCalls <= 0 || r.PublishCallsFrom != metricCalls {
		t.Errorf("%s: no CFS periods counted (%+v), or no publish calls (%v from %q)", r.Point, r.ThrottleEach, r.PublishCalls, r.PublishCallsFrom)
	}
}
