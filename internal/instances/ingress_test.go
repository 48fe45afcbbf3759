package instances

import (
	"reflect"
	"testing"
	"time"
)

// TestRecordIngress: a record carries the queue's ingress state as the
// instance gives it, with the tasks it wrote and the errors by cause over
// the record's span; a queue without an ingress has none, and the JSON
// round trip keeps it.
func TestRecordIngress(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	tot := IngressTotals{Errors: map[string]int64{}}
	r := New(nil, Options{ID: "h:1:ab", Queues: []string{"q", "plain"},
		Totals: func() map[string]Totals {
			return map[string]Totals{"q": {Ingress: IngressTotals{Ingested: tot.Ingested, Errors: map[string]int64{"bad_header": tot.Errors["bad_header"]}}}}
		},
		Sweeps: func(string) bool { return false },
		Ingress: func(q string) *Ingress {
			if q != "q" {
				return nil
			}
			return &Ingress{Exchange: "q.delayed", Consuming: true, Ready: 12, OldestMs: 1500}
		},
		Now: func() time.Time { return now }})
	tot.Ingested, tot.Errors["bad_header"] = 100, 1 // before the first sample: in the span (counted from the start)
	now = now.Add(Every)
	r.sampleNow()
	tot.Ingested += 50
	now = now.Add(Every)
	r.sampleNow()
	recs := r.Current()
	got := recs["q"].Ingress
	want := &Ingress{Exchange: "q.delayed", Consuming: true, Ready: 12, OldestMs: 1500, Ingested: 150, Errors: map[string]int64{"bad_header": 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ingress of the record: %+v, want %+v", got, want)
	}
	if recs["plain"].Ingress != nil {
		t.Errorf("a queue without an ingress has one in its record: %+v", recs["plain"].Ingress)
	}
	v, err := encode(recs["q"])
	if err != nil {
		t.Fatal(err)
	}
	back, err := decode("h:1:ab", "1800000000000 "+v)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Ingress, want) {
		t.Errorf("decode(encode(record)).Ingress = %+v, want %+v (JSON %s)", back.Ingress, want, v)
	}
}

// TestAddIngress: the queue's ingress as a whole: instances running it
// and consuming, the most ready and the oldest age any knows, the rate
// and the errors added up, and who does not consume and why.
func TestAddIngress(t *testing.T) {
	if s := AddIngress([]Record{{ID: "a"}}); s != nil {
		t.Errorf("no ingress in the records, yet a sum: %+v", s)
	}
	recs := []Record{
		{ID: "b", SpanMs: 60_000, Ingress: &Ingress{Exchange: "e", Ready: -1, Err: "connection lost"}},
		{ID: "a", SpanMs: 60_000, Ingress: &Ingress{Exchange: "e", Consuming: true, Ready: 7, OldestMs: 300, Ingested: 600, Errors: map[string]int64{"bad_header": 2}}},
		{ID: "c", SpanMs: 30_000, Ingress: &Ingress{Exchange: "e", Consuming: true, Ready: 9, OldestMs: 200, Ingested: 300, Errors: map[string]int64{"bad_header": 1, "redis": 5}}},
		{ID: "d"},
	}
	s := AddIngress(recs)
	if s.Exchange != "e" || s.Instances != 3 || s.Consuming != 2 || s.Ready != 9 || s.OldestMs != 300 || s.Rate != 20 || s.SpanMs != 60_000 {
		t.Errorf("sum %+v", s)
	}
	if got, want := s.ErrorText(), "redis 5, bad_header 3"; got != want || s.ErrorCount() != 8 {
		t.Errorf("errors %q (%d), want %q (8)", got, s.ErrorCount(), want)
	}
	if want := []NotConsuming{{"b", "connection lost"}}; !reflect.DeepEqual(s.NotConsuming, want) {
		t.Errorf("not consuming %v, want %v", s.NotConsuming, want)
	}
}
