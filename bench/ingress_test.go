package bench

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

func TestSampleEveryAndPacing(t *testing.T) {
	for rate, want := range map[int]int{1: 1, 500: 1, 501: 2, 2000: 4, 2001: 5, 100000: 200} {
		if got := sampleEvery(rate); got != want {
			t.Errorf("sampleEvery(%d) = %d, want %d", rate, got, want)
		}
	}
	for _, c := range []struct {
		i, rate int
		want    time.Duration
	}{{0, 2000, 0}, {1, 2000, 500 * time.Microsecond}, {2000, 2000, time.Second}, {3, 7, 428571428}} {
		if got := pacedAt(c.i, c.rate); got != c.want {
			t.Errorf("pacedAt(%d, %d) = %v, want %v", c.i, c.rate, got, c.want)
		}
	}
	if ingressQueueType(queueQuorum) != ingress.QuorumQueue || ingressQueueType(queueClassic) != ingress.ClassicQueue ||
		ingressQueueType(queueTransient) != ingress.ClassicQueue {
		t.Error("ingress queue types")
	}
}

// Publish to ingest: the due time at the consumer minus x-delay is the
// ingest time (Redis clock, ms), the publish time is ours (µs) moved to
// Redis's clock; tasks that did not arrive are left out.
func TestIngestFigures(t *testing.T) {
	pub := []int64{1_000_000_000, 1_000_000_500, 1_000_001_000, 1_000_002_000}
	due := []int64{1_000_000 + 1000 + 3, 1_000_000 + 1000 + 3, 0, 1_000_002 + 1000 + 7}
	got, first, last := ingestFigures(pub, due, 1000, 200)
	// (1,000,003 ms - 1,000,000,000 µs - 200) = 2,800 µs; then 2,300; then 6,800.
	if want := []int32{2800, 2300, 6800}; !slices.Equal(got, want) || first != 1_000_003 || last != 1_000_009 {
		t.Errorf("ingestFigures = %v, %d, %d; want %v, 1000003, 1000009", got, first, last, want)
	}
	if got, first, last := ingestFigures(pub, make([]int64, 4), 1000, 0); got != nil || first != 0 || last != 0 {
		t.Errorf("nothing arrived: %v, %d, %d", got, first, last)
	}
}

// The consumer's checks of a task that came through the ingress: its
// message_id and x-task-id are its id, its x-delay is as published; the
// due time is kept by index.
func TestRecorderIngress(t *testing.T) {
	rec := newRecorder(4, 8, -1000)
	rec.expectIngress(1000)
	now := time.Now()
	due := now.Add(-time.Millisecond).UnixMilli()
	deliver := func(i int, id string, h amqp.Table) {
		headers := amqp.Table{"x-due-ms": due, "x-task-id": string(taskID(nil, i)), "x-delay": int32(1000)}
		for k, v := range h {
			if v == nil {
				delete(headers, k)
			} else {
				headers[k] = v
			}
		}
		rec.record(&amqp.Delivery{Body: member(nil, i, 50), MessageId: id, Headers: headers}, now)
	}
	deliver(0, "t0", nil)
	deliver(1, "t1-123", nil)                                  // not the producer's message_id
	deliver(2, "t2", amqp.Table{"x-delay": nil})               // x-delay lost
	deliver(3, "t3", amqp.Table{"timestamp_in_ms": int64(12)}) // the broker's stamp
	deliver(0, "t0", nil)                                      // again
	if rec.unique.Load() != 4 || rec.dups.Load() != 1 || rec.badID.Load() != 1 || rec.badTaskID.Load() != 1 ||
		rec.brokerStamped.Load() != 1 || rec.early.Load() != 0 || rec.malformed.Load() != 0 {
		t.Errorf("unique %d dups %d badID %d badTaskID %d stamped %d early %d malformed %d", rec.unique.Load(), rec.dups.Load(),
			rec.badID.Load(), rec.badTaskID.Load(), rec.brokerStamped.Load(), rec.early.Load(), rec.malformed.Load())
	}
	if !slices.Equal(rec.dueByIndex, []int64{due, due, due, due}) {
		t.Errorf("due by index %v", rec.dueByIndex)
	}
}

func TestPlanIngress(t *testing.T) {
	o, err := parseOptions([]string{"-mode", "rate,ingress", "-rate", "2000,4000", "-ingress-max", "50k", "-ingress-drain", "-ids", "on", "-props"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range plan(o) {
		got = append(got, p.String())
		if p.Mode == modeIngress && (!p.IDs || p.Props) {
			t.Errorf("%s: ids %v props %v", p, p.IDs, p.Props)
		}
	}
	want := []string{
		"rate 2,000/s instances=1 shards=16 batch=500 size=200 ids+props",
		"rate 4,000/s instances=1 shards=16 batch=500 size=200 ids+props",
		"ingress 2,000/s instances=1 shards=16 batch=500 size=200",
		"ingress 4,000/s instances=1 shards=16 batch=500 size=200",
		"ingress max N=50,000 instances=1 shards=16 batch=500 size=200",
		"ingress drain N=50,000 instances=1 shards=16 batch=500 size=200",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if o, err := parseOptions([]string{"-mode", "ingress", "-ingress-max", "0"}, io.Discard); err != nil || len(plan(o)) != 1 || o.IngressPrefetch != 256 {
		t.Errorf("-ingress-max 0: %v, %v", err, o)
	}
	// Without ingress points the report's options stay as they were.
	if o, err := parseOptions(nil, io.Discard); err != nil || o.IngressMax != 0 || o.IngressPrefetch != 0 {
		t.Errorf("no ingress mode: %v, %+v", err, o)
	}
	for args, want := range map[string]string{
		"-mode ingress -ingress-max -1":               "-ingress-max -1: must be 0 (no max-ingest point) to 100000000",
		"-mode ingress -ingress-max 2e8":              "-ingress-max 200000000: must be 0 (no max-ingest point) to 100000000",
		"-mode ingress -ingress-prefetch 0":           "-ingress-prefetch 0: must be 1 to 65535",
		"-mode ingress -ingress-prefetch 7e4":         "invalid value",
		"-ingress-drain":                              "-ingress-drain: the drain is of the -ingress-max messages",
		"-mode ingress -ingress-max 0 -ingress-drain": "-ingress-drain: the drain is of the -ingress-max messages",
		"-mode ingress -ingress-max x":                `-ingress-max "x": x: not a count`,
	} {
		if _, err := parseOptions(strings.Fields(args), io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", args, err, want)
		}
	}
}

func TestIngressTable(t *testing.T) {
	d := func(p50, p99, max float64) *Dist { return &Dist{Count: 10, P50: p50, P99: p99, P999: max, Max: max} }
	rs := []*Result{
		{Point: Point{Mode: modeIngress, Rate: 2000, Instances: 2, Shards: 8, Batch: 500, Size: 200, IDs: true}, Delivered: 40000,
			Ceiling: 20000, Ratio: 0.1, Lateness: *d(2, 9, 20), DispatchLateness: d(1, 5, 10), CmdsPerTask: 7.5, CPUPer10k: 3,
			Ingress: &IngressResult{DelayMs: 1000, QueueType: "classic", Prefetch: 256, Published: 40000, PublishPerSec: 2000, IngestPerSec: 2000,
				ToRedis: d(1.5, 12, 30), SampleEvery: 4, ToIngest: d(1.1, 11, 29), Unseen: 2}},
		{Point: Point{Mode: modeIngress, Backlog: 100000, Instances: 2, Shards: 8, Batch: 500, Size: 200, IDs: true}, Delivered: 100000,
			Ceiling: 20000, Ratio: 0.6, Lateness: *d(2, 9, 20),
			Ingress: &IngressResult{Max: true, Window: 3000, DelayMs: 1000, QueueType: "classic", Prefetch: 256, Published: 100000, PublishPerSec: 13000,
				IngestPerSec: 12000, ToIngest: d(100, 900, 1000)}},
	}
	var b bytes.Buffer
	writeIngress(&b, rs, "")
	out := b.String()
	for _, want := range []string{
		"with x-delay 1s", "up to 3,000 unconfirmed",
		"| 2,000/s | 2 | 8 | 500 | 200 | classic | 256 | 40,000 | 2,000 | 2,000 | 20,000 | 0.10 | 1.50 / 12.0 / 30.0 | 4 | 1.10 / 11.0 / 29.0 | 1.00 / 5.00 / 10.0 / 10.0 | 2.00 / 9.00 / 20.0 / 20.0 | 7.50 | 3.00 | - | 0 | 0 |",
		"| max | 2 | 8 | 500 | 200 | classic | 256 | 100,000 | 13,000 | 12,000 | 20,000 | 0.60 | - | - | 100 / 900 / 1,000 | - |",
		"Note: ingress 2,000/s instances=2 shards=8 batch=500 size=200: the poll never found 2 of the messages it followed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// Ingress mode end to end: a paced point and a max-ingest point, two
// instances; every task arrives once, none early, with its id as
// message_id and x-task-id and the producer's x-delay; the figures are
// there (not judged: the machine is shared), and the ingress queue and
// exchange are removed with the rest.
func TestBenchIngress(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	code, stdout, stderr := runBench(t, "-mode", "ingress", "-rate", "500", "-duration", "2s", "-ingress-max", "3000", "-ingress-drain",
		"-instances", "2", "-shards", "4", "-batch", "200", "-size", "100", "-queue-type", "transient",
		"-ceiling-count", "2000", "-ceiling-window", "300", "-stall", "20s", "-json", jsonPath, "-dispatcher", binary)
	t.Logf("stdout:\n%s", stdout)
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| point | instances | shards |", "| 500/s | 2 | 4 | 200 | 100 | classic | 256 | 1,000 |",
		"| max | 2 | 4 | 200 | 100 | classic | 256 | 3,000 |", "| drain | 2 | 4 | 200 | 100 | classic | 256 | 3,000 |", "x-delay 1s"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 || len(rep.Results) != 3 || len(rep.Ceilings) != 1 {
		t.Fatalf("failures %q, %d results, %d ceilings", rep.Failures, len(rep.Results), len(rep.Ceilings))
	}
	paced, maxed, drained := rep.Results[0], rep.Results[1], rep.Results[2]
	for _, c := range []struct {
		r    *Result
		want int
	}{{paced, 1000}, {maxed, 3000}, {drained, 3000}} {
		r, g := c.r, c.r.Ingress
		if r.Scheduled != c.want || r.Delivered != c.want || r.Missing != 0 || r.Duplicates != 0 || r.Unexpected != 0 ||
			r.Early != 0 || r.BadID != 0 || r.BadTaskID != 0 || r.Malformed != 0 || len(r.Errors) != 0 {
			t.Errorf("%s: scheduled %d delivered %d missing %d dups %d unexpected %d early %d bad id %d bad task id %d malformed %d errors %q",
				r.Point, r.Scheduled, r.Delivered, r.Missing, r.Duplicates, r.Unexpected, r.Early, r.BadID, r.BadTaskID, r.Malformed, r.Errors)
		}
		if g == nil {
			t.Fatalf("%s: no ingress figures", r.Point)
		}
		if g.Published != c.want || g.Nacked != 0 || g.Returned != 0 || g.PublishPerSec <= 0 || g.IngestPerSec <= 0 || g.IngestSeconds <= 0 ||
			g.ToIngest == nil || g.ToIngest.Count != c.want || g.DelayMs != 1000 || g.QueueType != "classic" || g.Prefetch != 256 ||
			r.Ratio <= 0 || r.Ceiling <= 0 || r.CmdsPerTask <= 0 || r.CPUPer10k <= 0 || len(r.CPUSecondsEach) != 2 {
			t.Errorf("%s: %+v; ratio %v ceiling %v, %v cmds/task, %v CPU s/10k", r.Point, g, r.Ratio, r.Ceiling, r.CmdsPerTask, r.CPUPer10k)
		}
		checkViews(t, rep.DispatcherStamps, r)
	}
	// One in 1 of the paced point's messages followed into Redis; the
	// poll's ZSCOREs are the bench's own, taken out of the counts.
	if g := paced.Ingress; g.Max || g.SampleEvery != 1 || g.ToRedis == nil || g.ToRedis.Count+g.Unseen != 1000 || g.Unseen > 10 ||
		g.PollCommands < 1000 || paced.Redis.Subtracted["zscore"] != g.PollCommands {
		t.Errorf("paced: %+v, subtracted %v", g, paced.Redis.Subtracted)
	}
	// The max point publishes with the largest -ceiling-window.
	if g := maxed.Ingress; !g.Max || g.Drain || g.ToRedis != nil || g.Window != 300 {
		t.Errorf("max: %+v", g)
	}
	// The drain's messages were all confirmed before the instances
	// started: each waited in the ingress queue at least the start.
	if g := drained.Ingress; !g.Max || !g.Drain || g.ToRedis != nil || !drained.Drain || g.ToIngest.Min <= 0 {
		t.Errorf("drain: %+v", g)
	}
	assertCleanedUp(t, rep.RunID, paced.Name, maxed.Name, drained.Name)
	conn := testenv.AMQP(t)
	for _, r := range rep.Results {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		var ae *amqp.Error
		if _, err := ch.QueueDeclarePassive(ingress.QueueName(r.Name), true, false, false, false, nil); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Errorf("ingress queue of %s still there (%v)", r.Name, err)
		}
		ch.Close()
		if ch, err = conn.Channel(); err != nil {
			t.Fatal(err)
		}
		if err := ch.ExchangeDeclarePassive(r.Ingress.Exchange, "topic", true, false, false, false, nil); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Errorf("ingress exchange %s still there (%v)", r.Ingress.Exchange, err)
		}
		ch.Close()
	}
}
