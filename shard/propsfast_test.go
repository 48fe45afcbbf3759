package shard

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
)

// propsSeeds are properties JSON of every shape: what the fast parser
// takes and what it leaves to the full one.
var propsSeeds = []string{
	`{}`, ` {} `, "\v{}\n", `{"type":"t"}`, `{"headers":{}}`, `{"headers":{"a":"b"},"headers":{"c":"d"}}`,
	`{"headers":{"traceparent":"00-0af7651916cd43dd0000000000000001-b7ad6b7169203331-01"}}`,
	`{"routing_key":"orders.timeout","headers":{"tenant":"acme","attempt":2,"urgent":true,"no":false},"content_type":"application/json","correlation_id":"order-42","reply_to":"orders.replies","type":"order.timeout","priority":5,"expiration_ms":60000,"deadline_ms":1767225660000,"message_id":"m-1","amqp_headers":{"x-b3":{"t":"S","v":"a\"}b"},"l":{"t":"A","v":[{"t":"I","v":1}]}}}`,
	`{"priority":0}`, `{"priority":-0}`, `{"priority":00}`, `{"priority":255}`, `{"priority":256}`, `{"priority":1e2}`, `{"priority":1.0}`,
	`{"priority":9223372036854775807}`, `{"priority":9223372036854775808}`, `{"expiration_ms":-5}`, `{"deadline_ms":-9223372036854775808}`,
	`{"headers":{"n":2.0}}`, `{"headers":{"n":-0}}`, `{"headers":{"n":null}}`, `{"headers":{"n":tru}}`, `{"headers":{"n":truex}}`,
	`{"headers":{"a":1,"a":2}}`, `{"headers":{"":"a"}}`, `{"headers":{"x-task-id":"a"}}`, `{"headers":{"X-Due-Ms":1}}`,
	`{"headers":{"é":"ü"}}`, "{\"headers\":{\"a\":\"\xff\"}}", `{"headers":{"a":"\u00e9"}}`, `{"type":"a\nb"}`, "{\"type\":\"a\x01\"}",
	`{"Type":"t"}`, `{"routing_key":"a","colour":"red"}`, `{"type":"t","type":"u"}`, `{"type":null}`, `{"type":5}`,
	`{"type":"t",}`, `{"type":"t"} {}`, `{"type":"t"`, `{"type"}`, `{"amqp_headers":[]}`, `{"amqp_headers":{"a":}}`,
	`{"amqp_headers":{"a":"}"}}`, `{"amqp_headers":{"a":{"b":[1,{"c":"]"}]}}}`, `{"amqp_headers":null}`, `{"amqp_headers":{}} `,
	`{"routing_key":"` + string(bytes.Repeat([]byte("k"), 256)) + `"}`, `{"headers":{"n":-9007199254740993}}`,
}

// FuzzParseFast: whatever the fast parser takes, it reads as the full
// parser (encoding/json) does: the same error, and, without one, the same
// properties (with one, the full parser's may hold a json.Number where the
// fast one's holds its int64; every caller drops them on an error).
func FuzzParseFast(f *testing.F) {
	for _, s := range propsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tr := bytes.TrimSpace(b)
		fast, ok := parseFast(tr)
		if !ok {
			return
		}
		fastErr := fast.Validate()
		full, fullErr := parseFull(tr)
		if fmt.Sprint(fastErr) != fmt.Sprint(fullErr) {
			t.Fatalf("%q: the fast parser's error %v, the full one's %v", b, fastErr, fullErr)
		}
		if fullErr == nil && !reflect.DeepEqual(fast, full) {
			t.Fatalf("%q: the fast parser read %#v, the full one %#v", b, fast, full)
		}
	})
}

// TestParseFastTakesWhatProducersWrite: the shapes producers write go the
// fast way (a parser that left everything to encoding/json would pass
// FuzzParseFast too); escapes and the like are left to the full parser.
func TestParseFastTakesWhatProducersWrite(t *testing.T) {
	for _, in := range []string{propsSeeds[6], propsSeeds[7], `{}`, `{"headers":{}}`, `{"priority":256}`, `{"headers":{"é":"ü"}}`} {
		if _, ok := parseFast([]byte(in)); !ok {
			t.Errorf("%s: left to the full parser", in)
		}
	}
	for _, in := range []string{`{"headers":{"a":"\u00e9"}}`, `{"headers":{"n":2.0}}`, `{"type":null}`, `{"type":"t","type":"u"}`, `{"Type":"t"}`} {
		if _, ok := parseFast([]byte(in)); ok {
			t.Errorf("%s: read by the fast parser", in)
		}
	}
}
