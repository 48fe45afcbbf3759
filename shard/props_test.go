package shard_test

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/shard"
)

func TestParseProperties(t *testing.T) {
	ptr := func(n int) *int { return &n }
	ptr64 := func(n int64) *int64 { return &n }
	for _, tc := range []struct {
		name, in string
		want     shard.Properties
		err      string // a part of the error; "" for none
	}{
		{"not JSON", `routing_key=x`, shard.Properties{}, "not a JSON object"},
		{"empty", ``, shard.Properties{}, "not a JSON object"},
		{"a list", `[1]`, shard.Properties{}, "not a JSON object"},
		{"broken JSON", `{"routing_key":`, shard.Properties{}, "not valid JSON"},
		{"data after", `{} {}`, shard.Properties{}, "data after the JSON object"},
		{"unknown field", `{"routing_key":"a","colour":"red"}`, shard.Properties{}, `unknown field "colour"`},
		{"priority 300", `{"priority":300}`, shard.Properties{}, "priority 300 is not 0 to 255"},
		{"priority -1", `{"priority":-1}`, shard.Properties{}, "priority -1 is not 0 to 255"},
		{"priority a string", `{"priority":"high"}`, shard.Properties{}, `field "priority": a JSON string`},
		{"negative expiration", `{"expiration_ms":-5}`, shard.Properties{}, "expiration_ms -5 is negative"},
		{"deadline a float", `{"deadline_ms":1.5}`, shard.Properties{}, `field "deadline_ms"`},
		{"reserved header x-task-id", `{"headers":{"x-task-id":"a"}}`, shard.Properties{}, `"x-task-id" is reserved`},
		{"reserved header x-due-ms", `{"headers":{"X-Due-Ms":1}}`, shard.Properties{}, `"X-Due-Ms" is reserved`},
		{"reserved header x-dispatcher-", `{"headers":{"x-dispatcher-attempts":1}}`, shard.Properties{}, `"x-dispatcher-attempts" is reserved`},
		{"empty header name", `{"headers":{"":"a"}}`, shard.Properties{}, "empty header name"},
		{"float header", `{"headers":{"ratio":0.5}}`, shard.Properties{}, `"ratio": 0.5 is not an integer`},
		{"nested header", `{"headers":{"meta":{"a":1}}}`, shard.Properties{}, `"meta": an object`},
		{"list header", `{"headers":{"tags":["a"]}}`, shard.Properties{}, `"tags": a list`},
		{"null header", `{"headers":{"n":null}}`, shard.Properties{}, `"n": null (strings`},
		{"headers not an object", `{"headers":"a=b"}`, shard.Properties{}, `field "headers"`},

		{"empty object", `{}`, shard.Properties{}, ""},
		{"spaces around", " \n{\"type\":\"t\"}\n", shard.Properties{Type: "t"}, ""},
		{"every field", `{"routing_key":"rk","headers":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","n":42,"big":-9007199254740993,"ok":true},
			"content_type":"application/json","content_encoding":"gzip","correlation_id":"c-1","reply_to":"replies",
			"type":"order.timeout","priority":255,"expiration_ms":60000,"deadline_ms":1767225660000}`,
			shard.Properties{RoutingKey: "rk", Headers: map[string]any{
				"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
				"n":           int64(42), "big": int64(-9007199254740993), "ok": true},
				ContentType: "application/json", ContentEncoding: "gzip", CorrelationID: "c-1", ReplyTo: "replies",
				Type: "order.timeout", Priority: ptr(255), ExpirationMs: ptr64(60000), DeadlineMs: ptr64(1767225660000)}, ""},
		{"priority 0", `{"priority":0}`, shard.Properties{Priority: ptr(0)}, ""},
		{"a header like a reserved one", `{"headers":{"x-task-idx":"a","x-dispatcher":"b"}}`,
			shard.Properties{Headers: map[string]any{"x-task-idx": "a", "x-dispatcher": "b"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := shard.ParseProperties([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseProperties(%s) = %v; want an error with %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseProperties(%s): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseProperties(%s) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

// TestPropertiesRoundTrip: what Marshal writes, ParseProperties reads
// back the same; Marshal refuses what breaks the rules, as ParseProperties
// does, and takes Go ints for integer headers.
func TestPropertiesRoundTrip(t *testing.T) {
	prio, exp, deadline := 7, int64(0), int64(1767225660000)
	p := shard.Properties{RoutingKey: "orders.eu", ContentType: "text/plain", CorrelationID: "c",
		ReplyTo: "r", Type: "t", ContentEncoding: "identity", Priority: &prio, ExpirationMs: &exp, DeadlineMs: &deadline,
		Headers: map[string]any{"tenant": "acme", "attempt": 3, "max": int64(1) << 62, "urgent": false}}
	b, err := p.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := shard.ParseProperties(b)
	if err != nil {
		t.Fatalf("ParseProperties(%s): %v", b, err)
	}
	want := p
	want.Headers = map[string]any{"tenant": "acme", "attempt": int64(3), "max": int64(1) << 62, "urgent": false}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip of %s: got %+v, want %+v", b, got, want)
	}
	// An expiration of 0 is kept (a TTL of 0 is not "none").
	if !strings.Contains(string(b), `"expiration_ms":0`) {
		t.Errorf("Marshal dropped expiration_ms 0: %s", b)
	}
	if b, err := (shard.Properties{}).Marshal(); err != nil || string(b) != "{}" || !(shard.Properties{}).IsZero() {
		t.Errorf("zero properties: %s, %v", b, err)
	}
	for _, bad := range []shard.Properties{
		{Priority: func() *int { n := 256; return &n }()},
		{Headers: map[string]any{"x-task-id": "a"}},
		{Headers: map[string]any{"f": 1.5}},
		{Headers: map[string]any{"s": []string{"a"}}},
	} {
		if b, err := bad.Marshal(); err == nil {
			t.Errorf("Marshal(%+v) = %s, want an error", bad, b)
		}
	}
}

// ExampleProperties_Carrier puts trace context into a task's headers.
// With OpenTelemetry, the carrier goes to the propagator as it is:
//
//	props := shard.Properties{}
//	otel.GetTextMapPropagator().Inject(ctx, props.Carrier())
//	err := producer.ScheduleID(ctx, shard.IDTask{ID: id, Body: body, Props: &props, Due: due})
//
// (the shard module does not depend on OpenTelemetry: HeaderCarrier has
// the methods of propagation.TextMapCarrier). Here the propagator's Set
// is called by hand.
func ExampleProperties_Carrier() {
	props := shard.Properties{ContentType: "application/json"}
	c := props.Carrier()
	c.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	b, _ := props.Marshal()
	fmt.Println(c.Keys(), c.Get("traceparent"))
	fmt.Println(string(b))
	// Output:
	// [traceparent] 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
	// {"headers":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},"content_type":"application/json"}
}

// TestPropertiesAMQPLimits: what AMQP cannot carry is refused here, not
// by the broker dropping the connection: short strings over 255 bytes and
// properties over MaxPropertiesBytes.
func TestPropertiesAMQPLimits(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"reply_to":"` + strings.Repeat("r", 256) + `"}`, "reply_to is 256 bytes"},
		{`{"type":"` + strings.Repeat("t", 255) + `"}`, ""},
		{`{"headers":{"` + strings.Repeat("h", 256) + `":1}}`, "a name of 256 bytes"},
		{`{"headers":{"big":"` + strings.Repeat("b", shard.MaxPropertiesBytes) + `"}}`, "over 32768"},
	} {
		_, err := shard.ParseProperties([]byte(c.json))
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%.60s...: %v, want %q", c.json, err, c.want)
		}
	}
	big := shard.Properties{Headers: map[string]any{"big": strings.Repeat("b", shard.MaxPropertiesBytes)}}
	if _, err := big.Marshal(); err == nil {
		t.Error("Marshal of properties over the limit: no error")
	}
}

// TestHeaderVectors: CONTRACT.md's header test vectors, written out here
// as Go values (the Python and Node packages' tests have them in theirs):
// any header name but the reserved ones, integers of every Go integer type
// in int64's range, and a float only if it is a whole number within
// ±(2^53-1), stored as that integer.
func TestHeaderVectors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
		want  string // the stored JSON; "" for refused
	}{
		{"__proto__", "x", `{"headers":{"__proto__":"x"}}`},
		{"constructor", "y", `{"headers":{"constructor":"y"}}`},
		{"s", "", `{"headers":{"s":""}}`},
		{"b", true, `{"headers":{"b":true}}`},
		{"n", int(2), `{"headers":{"n":2}}`},
		{"n", int8(-128), `{"headers":{"n":-128}}`},
		{"n", int16(2), `{"headers":{"n":2}}`},
		{"n", int32(2), `{"headers":{"n":2}}`},
		{"n", int64(2), `{"headers":{"n":2}}`},
		{"n", uint(2), `{"headers":{"n":2}}`},
		{"n", uint8(255), `{"headers":{"n":255}}`},
		{"n", uint16(2), `{"headers":{"n":2}}`},
		{"n", uint32(4294967295), `{"headers":{"n":4294967295}}`},
		{"n", uint64(2), `{"headers":{"n":2}}`},
		{"n", uintptr(2), `{"headers":{"n":2}}`},
		{"max", int64(9223372036854775807), `{"headers":{"max":9223372036854775807}}`},
		{"min", int64(-9223372036854775808), `{"headers":{"min":-9223372036854775808}}`},
		{"over", uint64(9223372036854775808), ""},
		{"f", 2.0, `{"headers":{"f":2}}`},
		{"f", float32(2), `{"headers":{"f":2}}`},
		{"f", -9007199254740991.0, `{"headers":{"f":-9007199254740991}}`},
		{"f", 9007199254740992.0, ""},
		{"f", 2.5, ""},
		{"f", math.NaN(), ""},
		{"f", math.Inf(1), ""},
		{"x-due-ms", int64(1), ""},
		{"", "a", ""},
		{"l", []any{"a"}, ""},
		{"o", map[string]any{"a": 1}, ""},
		{"z", nil, ""},
	} {
		p := shard.Properties{Headers: map[string]any{tc.name: tc.value}}
		got, err := p.Marshal()
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("header %q = %#v: stored as %s; want refused", tc.name, tc.value, got)
		case tc.want == "":
			if tc.name != "" && !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.name)) {
				t.Errorf("header %q = %#v: the error %q does not name it", tc.name, tc.value, err)
			}
		case err != nil:
			t.Errorf("header %q = %#v: %v; want stored as %s", tc.name, tc.value, err, tc.want)
		case string(got) != tc.want:
			t.Errorf("header %q = %#v: stored as %s; want %s", tc.name, tc.value, got, tc.want)
		}
	}
	// The dispatcher reads stored JSON by the same rule: a whole number
	// written with a fraction or an exponent is that integer.
	for in, want := range map[string]any{
		`{"headers":{"__proto__":"x"}}`:         "x",
		`{"headers":{"n":2.0}}`:                 int64(2),
		`{"headers":{"n":2e3}}`:                 int64(2000),
		`{"headers":{"n":-9007199254740991.0}}`: int64(-9007199254740991),
		`{"headers":{"n":9223372036854775807}}`: int64(9223372036854775807),
		`{"headers":{"n":9007199254740992.0}}`:  nil,
		`{"headers":{"n":2.5}}`:                 nil,
		`{"headers":{"n":1e400}}`:               nil,
		`{"headers":{"n":9223372036854775808}}`: nil,
	} {
		p, err := shard.ParseProperties([]byte(in))
		if want == nil {
			if err == nil {
				t.Errorf("ParseProperties(%s) = %+v; want refused", in, p)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseProperties(%s): %v", in, err)
			continue
		}
		for _, v := range p.Headers {
			if v != want {
				t.Errorf("ParseProperties(%s): header %#v, want %#v", in, v, want)
			}
		}
	}
}
