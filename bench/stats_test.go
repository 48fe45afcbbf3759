package bench

import (
	"strings"
	"testing"
	"time"
)

func TestDistPercentiles(t *testing.T) {
	// 1..1000 ms in µs, shuffled by a stride.
	var s []int32
	for i := 0; i < 1000; i++ {
		s = append(s, int32((i*7919)%1000+1)*1000)
	}
	d := distOf(s)
	if d.Count != 1000 || d.Min != 1 || d.P50 != 500 || d.P90 != 900 || d.P99 != 990 || d.P999 != 999 || d.Max != 1000 || d.Mean != 500.5 {
		t.Errorf("dist %+v", d)
	}
	if s[0] != 1000 {
		t.Error("distOf sorted its input in place")
	}
	last := d.Curve[len(d.Curve)-1]
	if d.Curve[0].P != 0 || d.Curve[0].Ms != 1 || last.P != 1 || last.Ms != 1000 {
		t.Errorf("curve ends %+v %+v", d.Curve[0], last)
	}
	for i := 1; i < len(d.Curve); i++ {
		if d.Curve[i].P < d.Curve[i-1].P || d.Curve[i].Ms < d.Curve[i-1].Ms {
			t.Fatalf("curve not monotonic at %d: %+v", i, d.Curve[i-1:i+1])
		}
	}
	if e := distOf(nil); e.Count != 0 || e.Curve != nil {
		t.Error("empty dist")
	}
}

func TestShardDists(t *testing.T) {
	late := []int32{1000, 2000, 3000, 50000}
	shards := []uint16{0, 0, 2, 2}
	sd := shardDists(late, shards, 3)
	if len(sd) != 3 || sd[0].Count != 2 || sd[0].Max != 2 || sd[1].Count != 0 || sd[2].P50 != 3 || sd[2].Max != 50 {
		t.Errorf("shard dists %+v", sd)
	}
	median, worst, shard := shardSpread(sd)
	if median != 2 || worst != 50 || shard != 2 {
		t.Errorf("spread: median %v worst %v shard %d", median, worst, shard)
	}
}

func TestCmdStats(t *testing.T) {
	before := parseCmdStats("# Commandstats\r\ncmdstat_zadd:calls=10,usec=5,usec_per_call=0.5,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=1\r\n")
	after := parseCmdStats("cmdstat_zadd:calls=110,usec=50\r\ncmdstat_evalsha:calls=7,usec=9\r\ncmdstat_info:calls=9,usec=2\r\n" +
		"cmdstat_client|list:calls=1,usec=2\r\ncmdstat_replconf:calls=5,usec=1\r\n")
	// A second primary that was there all along, and a third promoted
	// during the measurement (no before: counted from its start).
	other := parseCmdStats("cmdstat_evalsha:calls=3\r\ncmdstat_zadd:calls=20\r\n")
	cpu := func(s string) (float64, bool) {
		return parseCPU("# CPU\r\nused_cpu_sys:" + s + "\r\nused_cpu_user:1.500000\r\nused_cpu_sys_children:9.000000\r\n")
	}
	cpuA0, ok0 := cpu("2.250000")
	cpuA1, ok1 := cpu("2.750000")
	if !ok0 || !ok1 || cpuA0 != 3.75 || cpuA1 != 4.25 {
		t.Fatalf("parseCPU: %v %v, %v %v", cpuA0, ok0, cpuA1, ok1)
	}
	if _, ok := parseCPU("# CPU\r\nused_cpu_sys:1.0\r\n"); ok {
		t.Error("parseCPU accepted INFO cpu without used_cpu_user")
	}
	ps := func(c cmdStats, cpu float64) primaryStats { return primaryStats{calls: c, cpuSec: cpu, hasCPU: true} }
	u := redisUse(redisSnap{"a:1": ps(before, cpuA0), "b:2": ps(other, 7)},
		redisSnap{"a:1": ps(after, cpuA1), "b:2": ps(other, 7.25), "c:3": ps(other, 0.125)},
		map[string]map[string]int64{"a:1": {"zadd": 40}, "c:3": {"zadd": 5}})
	u.setSeconds(2)
	if u.CPUSeconds == nil || *u.CPUSeconds != 0.5+0.25+0.125 || u.CPUPercent == nil || *u.CPUPercent != 43.75 {
		t.Errorf("Redis CPU %v s, %v %%", u.CPUSeconds, u.CPUPercent)
	}
	if p := u.Primaries[1]; p.CPUSeconds == nil || *p.CPUSeconds != 0.25 || *p.CPUPercent != 12.5 || p.CmdsPerSec != 0 {
		t.Errorf("primary b's CPU: %+v", p)
	}
	// One primary that would not tell its CPU: no Redis CPU at all.
	unknown := redisUse(redisSnap{"a:1": ps(before, 1)}, redisSnap{"a:1": ps(after, 2), "b:2": {calls: other}}, nil)
	unknown.setSeconds(1)
	if unknown.CPUSeconds != nil || unknown.CPUPercent != nil || unknown.Primaries[0].CPUSeconds == nil || unknown.Primaries[1].CPUSeconds != nil {
		t.Errorf("CPU with a primary unknown: %+v", unknown)
	}
	if u.Commands != 67+18 || u.ScriptCalls != 10 || u.ByCommand["zadd"] != 75 || u.ByCommand["info"] != 0 ||
		u.ByCommand["replconf"] != 0 || u.Subtracted["zadd"] != 45 {
		t.Errorf("use %+v", u)
	}
	if len(u.Primaries) != 3 {
		t.Fatalf("primaries %+v", u.Primaries)
	}
	a, b, c := u.Primaries[0], u.Primaries[1], u.Primaries[2]
	if a.Addr != "a:1" || a.Commands != 67 || a.ScriptCalls != 7 || a.ByCommand["zadd"] != 60 || a.Subtracted["zadd"] != 40 {
		t.Errorf("primary a: %+v", a)
	}
	if b.Addr != "b:2" || b.Commands != 0 || b.Subtracted != nil {
		t.Errorf("primary b: %+v", b)
	}
	if c.Addr != "c:3" || c.Commands != 18 || c.ScriptCalls != 3 || c.ByCommand["zadd"] != 15 {
		t.Errorf("primary c: %+v", c)
	}
}

func TestCountOthers(t *testing.T) {
	list := "id=1 addr=a name=dispatcher-bench-ab-bench age=9 idle=0 flags=N cmd=client|list\n" +
		"id=2 addr=b name=dispatcher-bench-ab-d-0 age=9 idle=0 flags=N cmd=evalsha\n" +
		"id=3 addr=c name= age=99 idle=2 flags=N cmd=get\n" +
		"id=4 addr=d name=other age=99 idle=50 flags=N cmd=get\n" +
		"id=5 addr=e name= age=99 idle=0 flags=S cmd=replconf\n"
	if n := countOthers(list, "dispatcher-bench-ab", 10*time.Second); n != 1 {
		t.Errorf("countOthers = %d, want 1", n)
	}
}

func TestWithQuery(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://u:p@h:1/2": "redis://u:p@h:1/2?client_name=n&pool_size=8",
		"redis+cluster://h:7000?addr=h:7001&addr=h:7002":     "redis+cluster://h:7000?addr=h%3A7001&addr=h%3A7002&client_name=n&pool_size=8",
		"redis+sentinel://h:26379?master_name=m&pool_size=1": "redis+sentinel://h:26379?client_name=n&master_name=m&pool_size=8",
	} {
		got, err := withQuery(raw, "client_name", "n", "pool_size", "8")
		if err != nil || got != want {
			t.Errorf("withQuery(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	if _, err := withQuery("redis://u:p@h:1/%zz", "client_name", "n"); err == nil || strings.Contains(err.Error(), "u:p") {
		t.Errorf("bad URL: %v", err)
	}
}

func TestProcParsing(t *testing.T) {
	stat := "4242 (dispatcher (x)) S 1 4242 4242 0 -1 4194304 500 0 0 0 250 130 0 0 20 0 9 0 100 0 0"
	if cpu, err := parseStatCPU(stat); err != nil || cpu != 3.8 {
		t.Errorf("parseStatCPU = %v, %v; want 3.8", cpu, err)
	}
	if hwm, err := parseHWM("Name:\tdispatcher\nVmPeak:\t 9 kB\nVmHWM:\t   20480 kB\n"); err != nil || hwm != 20<<20 {
		t.Errorf("parseHWM = %d, %v", hwm, err)
	}
	m, err := parseMetrics(strings.NewReader("# HELP x\ndispatcher_tasks_dispatched_total{queue=\"a\"} 5\n"+
		"dispatcher_tasks_dispatched_total{queue=\"b\"} 7\ndispatcher_tasks_dispatched_totalx 100\n"+
		"dispatcher_claim_batch_size_sum{queue=\"a\"} 1.5e3\n"),
		[]string{"dispatcher_tasks_dispatched_total", "dispatcher_claim_batch_size_sum"})
	if err != nil || m["dispatcher_tasks_dispatched_total"] != 12 || m["dispatcher_claim_batch_size_sum"] != 1500 {
		t.Errorf("parseMetrics = %v, %v", m, err)
	}
}

func TestSVGLabels(t *testing.T) {
	for n, want := range map[float64]string{0: "0%", 1: "90%", 2: "99%", 3: "99.9%", 5: "99.999%"} {
		if got := ninesLabel(n); got != want {
			t.Errorf("ninesLabel(%v) = %q, want %q", n, got, want)
		}
	}
	svg := string(renderSVG([]panel{{title: "a < b", series: []series{{label: "x=1 & y", dist: distOf([]int32{0, 500, 20000})}}}}))
	if !strings.Contains(svg, "a &lt; b") || !strings.Contains(svg, "x=1 &amp; y") || strings.Count(svg, "<polyline") != 1 {
		t.Errorf("svg:\n%s", svg)
	}
	// A dispatch view is a second, dashed curve in the same colour, with
	// a legend line of its own.
	d := distOf([]int32{100, 200, 9000})
	svg = string(renderSVG([]panel{{title: "t", series: []series{{label: "a", dist: distOf([]int32{0, 500, 20000}), dispatch: &d}}}}))
	if strings.Count(svg, "<polyline") != 2 || strings.Count(svg, `stroke-dasharray="6 3"`) != 2 || !strings.Contains(svg, "dispatch view  (p50 0.20, p99 9.00") {
		t.Errorf("svg with a dispatch view:\n%s", svg)
	}
}
