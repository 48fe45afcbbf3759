package tests

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// zadd schedules member with a raw ZADD, as a producer in any language
// would, with any score.
func (h *harness) zadd(q queueSpec, member []byte, score float64) {
	h.t.Helper()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	if err := h.rdb.ZAdd(context.Background(), k.Shard(member, q.Shards), redis.Z{Score: score, Member: member}).Err(); err != nil {
		h.t.Fatal(err)
	}
}

// metric reads one sample of the dispatcher's /metrics, e.g.
// `dispatcher_tasks_seconds_scores_total{queue="sec"}`; -1 if absent.
func metric(t *testing.T, addr, sample string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`)
	m := re.FindStringSubmatch(get(t, "http://"+addr+"/metrics"))
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("metric %s: %v", sample, err)
	}
	return v
}

// TestSecondsScores: a producer that writes seconds instead of
// milliseconds schedules tasks that, read as ms, fell due in 1970. They go
// out at once, with the message_id of the score as written, are counted in
// dispatcher_tasks_seconds_scores_total{queue} and warned about. Scores
// below that range (0, negative, -inf) and fractional ones go out too,
// uncounted. For the tasks due at once, the FAULT line's lateness counts
// from when they were scheduled.
func TestSecondsScores(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "sec", Shards: 4})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	p := h.start()
	q := h.queues[0]
	eventually(t, 20*time.Second, "the metric registered", func() bool {
		_, err := httpGet("http://" + addr + "/metrics")
		return err == nil
	})

	const n = 50
	now := time.Now()
	want := map[string]int64{}
	for i := 0; i < n; i++ {
		m := []byte(fmt.Sprint("sec-", i))
		due := now.Unix() + 60 // "in a minute", in seconds
		h.zadd(q, m, float64(due))
		want[shard.MessageID(m, due)] = now.UnixMilli()
	}
	odd := []struct {
		member string
		score  float64
		dueMs  int64 // what the message_id carries
	}{
		{"zero", 0, 0},
		{"negative", -1, -1},
		// -inf is no integer: it is dispatched as due at 0, the epoch.
		{"minus-infinity", math.Inf(-1), 0},
		{"fraction-past", float64(now.UnixMilli()) - 1000.75, now.UnixMilli() - 1001},
	}
	for _, o := range odd {
		h.zadd(q, []byte(o.member), o.score)
		want[shard.MessageID([]byte(o.member), o.dueMs)] = now.UnixMilli()
	}
	// A fractional score in the future is due at its floor, not early.
	fut := now.Add(500 * time.Millisecond).UnixMilli()
	h.zadd(q, []byte("fraction-future"), float64(fut)+0.75)
	want[shard.MessageID([]byte("fraction-future"), fut)] = fut

	h.verify("sec", want, 20*time.Second, 0)
	eventually(t, 5*time.Second, "seconds scores counted", func() bool {
		return metric(t, addr, `dispatcher_tasks_seconds_scores_total{queue="sec"}`) == n
	})
	if !strings.Contains(p.out.String(), "score looks like seconds") {
		t.Fatalf("no warning about seconds scores logged:\n%s", tail(p.out.String(), 2000))
	}
	if got := strings.Count(p.out.String(), "score looks like seconds"); got > 3 {
		t.Fatalf("warning logged %d times: it must be rate-limited", got)
	}
}

// oddMembers are members that break naive code: empty, NUL, every byte
// value, invalid UTF-8, look-alikes of the in-flight entry "<due>:<member>",
// line breaks, and a large random one.
func oddMembers() [][]byte {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	rev := make([]byte, 256)
	for i := range rev {
		rev[i] = byte(255 - i)
	}
	large := make([]byte, 256<<10)
	rand.New(rand.NewSource(1)).Read(large)
	ms := [][]byte{
		{}, {0}, {0, 0, 0}, all, rev, large,
		[]byte("\xff\xfe\xfd"), []byte("\xc3\x28"), []byte("\xed\xa0\x80"), []byte("\xf4\x90\x80\x80"), []byte("a\x80b"),
		[]byte(":"), []byte("::"), []byte("0:"), []byte("123:456"), []byte("-1:x"), []byte("1767225600000:dup"),
		[]byte("\r\n"), []byte("line1\nline2\r\n"), []byte("задача"), []byte(" "), []byte("\t"),
	}
	for b := 0; b < 256; b++ {
		if b != 0 && b != ':' && b != ' ' && b != '\t' {
			ms = append(ms, []byte{byte(b)})
		}
	}
	return ms
}

// TestOddMembers: empty and binary members are delivered byte for byte,
// with the contract's message_id, x-due-ms header and persistent mode.
func TestOddMembers(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "odd", Shards: 16})
	rec := h.record("odd")
	h.start()
	due := time.Now().Add(500 * time.Millisecond)
	members := oddMembers()
	body := map[string][]byte{}
	for _, m := range members {
		id := shard.MessageID(m, due.UnixMilli())
		if _, dup := body[id]; dup {
			t.Fatalf("member %q listed twice", m)
		}
		body[id] = m
	}
	want := scheduleAt(t, h.producer("odd"), due, members...)
	h.verify("odd", want, 20*time.Second, 0)
	checkDeliveries(t, rec.all(), body, due.UnixMilli())
}

var messageIDRE = regexp.MustCompile(`^[0-9a-f]{16}-[0-9]+$`)

// checkDeliveries checks every delivery against the contract: its body is
// the member of its message_id byte for byte, its x-due-ms header the due
// time, and it is persistent.
func checkDeliveries(t *testing.T, got []received, body map[string][]byte, dueMs int64) {
	t.Helper()
	if len(got) < len(body) {
		t.Fatalf("recorded %d deliveries, want at least %d", len(got), len(body))
	}
	for _, r := range got {
		d := r.d
		m, ok := body[d.MessageId]
		switch {
		case !ok:
			t.Errorf("unexpected message_id %q", d.MessageId)
		case !bytes.Equal(d.Body, m):
			t.Errorf("message %s: body %.40q, want %.40q (%d vs %d bytes)", d.MessageId, d.Body, m, len(d.Body), len(m))
		case !messageIDRE.MatchString(d.MessageId):
			t.Errorf("message_id %q not in the contract's form", d.MessageId)
		case d.DeliveryMode != 2:
			t.Errorf("message %s: delivery mode %d, want 2", d.MessageId, d.DeliveryMode)
		case fmt.Sprint(d.Headers["x-due-ms"]) != strconv.FormatInt(dueMs, 10):
			t.Errorf("message %s: x-due-ms %v, want %d", d.MessageId, d.Headers["x-due-ms"], dueMs)
		}
	}
}
