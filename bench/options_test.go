package bench

import (
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCount(t *testing.T) {
	for in, want := range map[string]int{"1000": 1000, "1e3": 1000, "10^7": 10_000_000, "1k": 1000, "2.5M": 2_500_000, "0": 0} {
		if got, err := parseCount(in); err != nil || got != want {
			t.Errorf("parseCount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "1.5", "10^x", "-1e3", "1e30"} {
		if got, err := parseCount(in); err == nil {
			t.Errorf("parseCount(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseOptionsErrorsNameTheFlag(t *testing.T) {
	for args, want := range map[string]string{
		"-mode fast":                  `-mode "fast"`,
		"-shards 0":                   `-shards "0"`,
		"-shards 16,5000":             `-shards "16,5000": 5000: must be 1 to 4096`,
		"-size 8":                     `-size "8"`,
		"-backlog 1e3,x":              `-backlog "1e3,x"`,
		"-queue-type stream":          `-queue-type "stream"`,
		"-duration 10ms":              `-duration 10ms`,
		"-ceiling-window 0":           `-ceiling-window "0"`,
		"-instances 1,2,4,100":        `-instances "1,2,4,100"`,
		"-queues 0":                   `-queues "0": 0: must be 1 to 1000`,
		"-queues 1,2000":              `-queues "1,2000"`,
		"-prefetch -1":                `-prefetch -1: must be 0 to 65535`,
		"-prefetch 70000":             `-prefetch 70000`,
		"-autoack -prefetch 5":        `-prefetch 5 with -autoack`,
		"stray":                       `unexpected argument "stray"`,
		"-mode scale,fast":            `-mode "scale,fast": want backlog, rate, idle, burst, memory, scale or ingress`,
		"-cpu-cap -0.5":               `-cpu-cap -0.5: must be 0 (no cap) or a share of one core up to 64`,
		"-cpu-cap NaN":                `-cpu-cap NaN`,
		"-cpu-cap 0.05":               `-cpu-cap 0.05 with -cpu-period 10ms: a quota of 500 µs, under the kernel's minimum of 1000 µs; give a -cpu-period of at least 20ms`,
		"-cpu-cap 0.1 -cpu-period 2s": `-cpu-period 2s: must be 1ms to 1s`,
		"-scale-p99 0s":               `-scale-p99 0s: must be more than 0`,
		"-scale-step 1s":              `-scale-step 1s: must be at least 2s`,
		"-scale-steps 0":              `-scale-steps 0: must be at least 1`,
		"-scale-precision 1":          `-scale-precision 1: must be more than 0 and less than 1`,
		"-floor -mode backlog":        `-floor with -mode backlog: only rate and scale points measure the floor`,
		"-mode scale -rate 50":        `-rate 50: scale mode starts from the first rate, at least 100`,
	} {
		_, err := parseOptions(strings.Fields(args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %s", args, err, want)
		}
	}
	o, err := parseOptions([]string{"-backlog", "10^3,10^7", "-instances", "1,2,4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Backlogs, []int{1000, 10_000_000}) || !slices.Equal(o.Instances, []int{1, 2, 4}) ||
		!slices.Equal(o.Modes, []string{"backlog", "rate"}) || o.Window != 200000 || o.QueueType != "classic" {
		t.Errorf("options %+v", o)
	}
}

func TestParseConsumerAndQueueOptions(t *testing.T) {
	for _, c := range []struct {
		args     string
		autoAck  bool
		prefetch int
		queues   []int
		text     string
	}{
		{"", false, 1000, []int{1}, "manual ack of each delivery right after it is recorded, prefetch 1,000"},
		{"-prefetch 50 -queues 20", false, 50, []int{20}, "manual ack of each delivery right after it is recorded, prefetch 50"},
		{"-prefetch 0 -queues 1,10,1e2", false, 0, []int{1, 10, 100}, "manual ack of each delivery right after it is recorded, prefetch unlimited"},
		{"-autoack", true, 0, []int{1}, "auto-ack (no prefetch)"},
		{"-autoack=false -prefetch 7", false, 7, []int{1}, "manual ack of each delivery right after it is recorded, prefetch 7"},
	} {
		o, err := parseOptions(strings.Fields(c.args), io.Discard)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if o.AutoAck != c.autoAck || o.Prefetch != c.prefetch || !slices.Equal(o.Queues, c.queues) || o.consumerText() != c.text {
			t.Errorf("%q: autoack %v prefetch %d queues %v %q", c.args, o.AutoAck, o.Prefetch, o.Queues, o.consumerText())
		}
	}
	// The JSON options say which consumer was measured.
	o, err := parseOptions([]string{"-prefetch", "300"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"autoack":false,"prefetch":300`) || !strings.Contains(string(b), `"queues":[1]`) {
		t.Errorf("JSON options: %s", b)
	}
	// Usage names the new flags.
	var help strings.Builder
	if _, err := parseOptions([]string{"-h"}, &help); err != errHelp {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"-prefetch", "-autoack", "-queues", "x-published-us", "Redis CPU", "first second"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

func TestPlanIdleQueues(t *testing.T) {
	o, err := parseOptions([]string{"-mode", "idle", "-queues", "1,20", "-instances", "1,2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range plan(o) {
		got = append(got, p.String())
	}
	want := []string{
		"idle background (no instance) pending=0",
		"idle instances=1 shards=16 pending=0",
		"idle instances=2 shards=16 pending=0",
		"idle instances=1 queues=20 shards=16 pending=0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// -queues applies to rate points too (not to backlog ones): swept like
// any list, and named in the point only when above 1.
func TestPlanRateQueues(t *testing.T) {
	o, err := parseOptions([]string{"-mode", "backlog,rate", "-backlog", "1000", "-rate", "2000,1", "-queues", "1,1e2", "-instances", "1,2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Queues, []int{1, 100}) {
		t.Fatalf("queues %v", o.Queues)
	}
	var got []string
	for _, p := range plan(o) {
		got = append(got, p.String())
		if p.Mode == modeRate && p.Queues < 1 || p.Mode == modeBacklog && p.Queues != 0 {
			t.Errorf("%s: %d queues", p, p.Queues)
		}
	}
	want := []string{
		"backlog N=1,000 due=1,000 instances=1 shards=16 batch=500 size=200",
		"backlog N=1,000 due=1,000 instances=2 shards=16 batch=500 size=200",
		"rate 2,000/s instances=1 shards=16 batch=500 size=200",
		"rate 1/s instances=1 shards=16 batch=500 size=200",
		"rate 2,000/s instances=2 shards=16 batch=500 size=200",
		"rate 2,000/s queues=100 instances=1 shards=16 batch=500 size=200",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	o.Cross = true
	n := 0
	for _, p := range plan(o) {
		if p.Mode == modeRate {
			n++
		}
	}
	if n != 8 {
		t.Errorf("cross product: %d rate points, want 8", n)
	}
	// The JSON of a rate point says how many queues, 1 included.
	b, err := json.Marshal(Point{Mode: modeRate, Rate: 2000, Instances: 1, Queues: 1, Shards: 16})
	if err != nil || !strings.Contains(string(b), `"queues":1`) {
		t.Errorf("rate point JSON %s, %v", b, err)
	}
}

func TestPlanSweepsOneListAtATime(t *testing.T) {
	o, err := parseOptions([]string{"-mode", "backlog,idle", "-backlog", "1e5,1e3,1e7", "-instances", "1,2,4", "-window", "200000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ps := plan(o)
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	want := []string{
		"backlog N=100,000 due=100,000 instances=1 shards=16 batch=500 size=200",
		"backlog N=1,000 due=1,000 instances=1 shards=16 batch=500 size=200",
		"backlog N=10,000,000 due=200,000 instances=1 shards=16 batch=500 size=200",
		"backlog N=100,000 due=100,000 instances=2 shards=16 batch=500 size=200",
		"backlog N=100,000 due=100,000 instances=4 shards=16 batch=500 size=200",
		"idle background (no instance) pending=0",
		"idle instances=1 shards=16 pending=0",
		"idle instances=2 shards=16 pending=0",
		"idle instances=4 shards=16 pending=0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	o.Cross, o.Drain, o.Modes = true, true, []string{"backlog"}
	ps = plan(o)
	if len(ps) != 9 {
		t.Errorf("cross product: %d points, want 9", len(ps))
	}
	for _, p := range ps {
		if p.Window != p.Backlog {
			t.Errorf("-drain: %s", p)
		}
	}
}

func TestMemberRoundTrip(t *testing.T) {
	for _, i := range []int{0, 7, 123456, 99_999_999} {
		m := member(nil, i, 16)
		if len(m) != 16 {
			t.Errorf("member(%d) has %d bytes", i, len(m))
		}
		if got, ok := memberIndex(m); !ok || got != i {
			t.Errorf("memberIndex(%q) = %d, %v", m, got, ok)
		}
	}
	for _, body := range []string{"", ":", "x1:", "12", "12345678901:x"} {
		if _, ok := memberIndex([]byte(body)); ok {
			t.Errorf("memberIndex(%q) accepted a body the bench did not write", body)
		}
	}
}

func TestCommandLineHidesPasswords(t *testing.T) {
	got := commandLine([]string{"-redis", "redis://:s3cret@host:6379/0", "-amqp=amqp://u:pa55@h/", "-backlog", "1e3"})
	if strings.Contains(got, "s3cret") || strings.Contains(got, "pa55") || !strings.Contains(got, "-backlog 1e3") {
		t.Errorf("commandLine = %s", got)
	}
}

func TestPairsPerZADD(t *testing.T) {
	for size, want := range map[int]int{16: 1000, 200: 1000, 8192: 512, 16 << 20: 1} {
		if got := pairsPerZADD(size); got != want {
			t.Errorf("pairsPerZADD(%d) = %d, want %d", size, got, want)
		}
	}
}

func TestParseCapScaleAndFloorOptions(t *testing.T) {
	o, err := parseOptions(strings.Fields("-mode scale -instances 1,2,4 -cpu-cap 0.1 -floor"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.CPUCap != 0.1 || time.Duration(o.CPUPeriod) != 10*time.Millisecond || !o.Floor || time.Duration(o.ScaleP99) != 50*time.Millisecond ||
		time.Duration(o.ScaleStep) != 8*time.Second || o.ScaleSteps != 8 || o.ScalePrecision != 0.1 {
		t.Errorf("options %+v", o)
	}
	// One scale point per instance count, at the other lists' first values.
	pts := plan(o)
	if len(pts) != 3 || pts[2] != (Point{Mode: modeScale, Instances: 4, Shards: 16, Batch: 500, Size: 200, Queues: 1}) {
		t.Errorf("plan %+v", pts)
	}
	if got := pts[0].String(); got != "scale instances=1 shards=16 batch=500 size=200" {
		t.Errorf("point %q", got)
	}
	// No cap by default.
	if o, err := parseOptions(nil, io.Discard); err != nil || o.CPUCap != 0 || o.Floor {
		t.Errorf("defaults: %+v, %v", o, err)
	}
}
