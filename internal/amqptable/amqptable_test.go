package amqptable

import (
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestRoundTrip: every AMQP table type comes back with its own Go type.
func TestRoundTrip(t *testing.T) {
	in := amqp.Table{"s": "x", "b": true, "i8": int8(-1), "i16": int16(2), "i32": int32(-3), "i64": int64(1) << 60,
		"u8": uint8(250), "u16": uint16(60000), "u32": uint32(4e9), "f32": float32(0.5), "f64": -1e300,
		"dec": amqp.Decimal{Scale: 3, Value: -42}, "ts": time.Unix(1767225600, 0).UTC(), "bytes": []byte{0, 255},
		"arr": []any{int8(1), "a", []any{}}, "table": amqp.Table{"t": amqp.Table{"x": nil}}, "void": nil}
	b, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip\n got %#v\nwant %#v\n(JSON %s)", out, in, b)
	}
}

// TestDecodeErrors name the header and the type.
func TestDecodeErrors(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":{"t":"i8","v":300}}`:                `"a" of type i8`,
		`{"a":{"t":"nope","v":1}}`:                `"a" has unknown type "nope"`,
		`{"a":{"t":"table","v":{"b":{"t":"x"}}}}`: `"a.b" has unknown type "x"`,
		`[1]`: `amqp_headers:`,
		`{"a":{"t":"dec","v":{"scale":1,"z":1}}}`: `"a" of type dec`,
	} {
		_, err := Decode([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want an error with %q", in, err, want)
		}
	}
}
