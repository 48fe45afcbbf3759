package shard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strings"
)

// MaxIDBytes is the longest task id the contract allows.
const MaxIDBytes = 1024

// MaxPropertiesBytes is the largest properties JSON the contract allows:
// the AMQP header frame they become must fit in one frame (RabbitMQ's
// frame_max is 128 KiB by default), or the broker drops the connection.
const MaxPropertiesBytes = 32 << 10

// maxShortString is AMQP's limit on a short string: the routing key, the
// basic properties and every header name.
const maxShortString = 255

// ValidID reports why id cannot be a task id (1 to 1024 bytes), or nil.
func ValidID(id []byte) error {
	if len(id) == 0 || len(id) > MaxIDBytes {
		return fmt.Errorf("task id of %d bytes: must be 1 to %d bytes", len(id), MaxIDBytes)
	}
	return nil
}

// Properties are a task's message properties, stored as a JSON object in
// P:{Q:i}:props (see CONTRACT.md). Every field is optional; the zero
// value changes nothing about the message.
type Properties struct {
	// RoutingKey replaces the queue's routing key for this task (the
	// exchange stays the queue's).
	RoutingKey string `json:"routing_key,omitempty"`
	// Headers are added to the message's AMQP headers: values are strings,
	// booleans, integers of any Go integer type within int64's range, or
	// floats that are whole numbers within ±(2^53-1) (stored as integers;
	// CONTRACT.md's header vectors). Any name but x-dispatcher-*, x-task-id
	// and x-due-ms. W3C trace context travels as traceparent/tracestate.
	Headers map[string]any `json:"headers,omitempty"`

	ContentType     string `json:"content_type,omitempty"`
	ContentEncoding string `json:"content_encoding,omitempty"`
	CorrelationID   string `json:"correlation_id,omitempty"`
	ReplyTo         string `json:"reply_to,omitempty"`
	Type            string `json:"type,omitempty"`
	// Priority is the AMQP priority, 0 to 255 (nil: none).
	Priority *int `json:"priority,omitempty"`
	// ExpirationMs is the per-message TTL the broker applies once it has
	// the message (nil: none).
	ExpirationMs *int64 `json:"expiration_ms,omitempty"`
	// DeadlineMs (ms since the epoch, nil: none): a task that cannot be
	// published by then is dead-lettered ("deadline passed") instead of
	// being published late.
	DeadlineMs *int64 `json:"deadline_ms,omitempty"`
	// MessageID, when set, is the published message_id instead of the
	// dispatcher's own (the AMQP ingress keeps the producer's).
	MessageID string `json:"message_id,omitempty"`
	// AMQPHeaders are headers of every AMQP table type as typed JSON
	// (CONTRACT.md; written and read by internal/amqptable); they are
	// added to the message's headers at publish time.
	AMQPHeaders json.RawMessage `json:"amqp_headers,omitempty"`
}

// ReservedHeader reports whether a header name is the dispatcher's own.
func ReservedHeader(name string) bool {
	l := strings.ToLower(name)
	return strings.HasPrefix(l, "x-dispatcher-") || l == "x-task-id" || l == "x-due-ms"
}

// Validate reports the first field that breaks the contract's rules.
func (p *Properties) Validate() error {
	for _, f := range []struct{ name, v string }{{"routing_key", p.RoutingKey}, {"content_type", p.ContentType},
		{"content_encoding", p.ContentEncoding}, {"correlation_id", p.CorrelationID}, {"reply_to", p.ReplyTo}, {"type", p.Type}, {"message_id", p.MessageID}} {
		if len(f.v) > maxShortString {
			return fmt.Errorf("properties: %s is %d bytes, over AMQP's %d", f.name, len(f.v), maxShortString)
		}
	}
	if p.Priority != nil && (*p.Priority < 0 || *p.Priority > 255) {
		return fmt.Errorf("properties: priority %d is not 0 to 255", *p.Priority)
	}
	if p.ExpirationMs != nil && *p.ExpirationMs < 0 {
		return fmt.Errorf("properties: expiration_ms %d is negative", *p.ExpirationMs)
	}
	names := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		names = append(names, k)
	}
	sort.Strings(names) // the same error for the same input
	for _, k := range names {
		if k == "" {
			return errors.New("properties: headers: empty header name")
		}
		if len(k) > maxShortString {
			return fmt.Errorf("properties: headers: a name of %d bytes, over AMQP's %d: %.40q...", len(k), maxShortString, k)
		}
		if ReservedHeader(k) {
			return fmt.Errorf("properties: headers: %q is reserved for the dispatcher", k)
		}
		v, err := headerValue(p.Headers[k])
		if err != nil {
			return fmt.Errorf("properties: headers: %q: %w", k, err)
		}
		p.Headers[k] = v
	}
	if len(p.AMQPHeaders) > 0 {
		if t := bytes.TrimSpace(p.AMQPHeaders); len(t) == 0 || t[0] != '{' || !json.Valid(t) {
			return fmt.Errorf("properties: amqp_headers is not a JSON object: %.40q", p.AMQPHeaders)
		}
	}
	return nil
}

// maxWholeFloat is the largest whole number a float header value may be
// (2^53-1): beyond it a float no longer holds every integer, and Node's
// producer, where 2.0 and 2 are one number, refuses such numbers too.
const maxWholeFloat = 1<<53 - 1

// headerValue is a header value as stored (string, bool or int64) by the
// contract's one rule for all producers: integers of any integer type in
// int64's range, and a float (or a JSON number written with a fraction or
// an exponent) only if it is a whole number within ±(2^53-1).
func headerValue(v any) (any, error) {
	const only = "(strings, integers and booleans only)"
	switch v := v.(type) {
	case string, bool, int64:
		return v, nil
	case int:
		return int64(v), nil
	case int8:
		return int64(v), nil
	case int16:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case uint, uint8, uint16, uint32, uint64, uintptr:
		u := reflect.ValueOf(v).Uint()
		if u > math.MaxInt64 {
			return nil, fmt.Errorf("%d is over the 64-bit integers' %d", u, int64(math.MaxInt64))
		}
		return int64(u), nil
	case float32:
		return wholeFloat(float64(v), fmt.Sprint(v))
	case float64:
		return wholeFloat(v, fmt.Sprint(v))
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n, nil
		}
		if strings.ContainsAny(string(v), ".eE") {
			if f, err := v.Float64(); err == nil {
				return wholeFloat(f, string(v))
			}
		}
		return nil, fmt.Errorf("%s is not a 64-bit integer %s", v, only)
	}
	return nil, fmt.Errorf("%s %s", jsonKind(v), only)
}

func wholeFloat(f float64, text string) (any, error) {
	if f != math.Trunc(f) || math.Abs(f) > maxWholeFloat { // NaN and ±Inf fail one or the other
		return nil, fmt.Errorf("%s is not an integer within ±(2^53-1) (strings, integers and booleans only)", text)
	}
	return int64(f), nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("a %T", v)
}

// ParseProperties reads and validates a properties JSON object: not JSON,
// an unknown field, a value of the wrong type or out of range is an error
// naming the field.
func ParseProperties(b []byte) (Properties, error) {
	var p Properties
	if len(b) > MaxPropertiesBytes {
		return p, fmt.Errorf("properties are %d bytes, over %d", len(b), MaxPropertiesBytes)
	}
	t := bytes.TrimSpace(b)
	if len(t) == 0 || t[0] != '{' {
		return p, fmt.Errorf("properties are not a JSON object: %.40q", b)
	}
	if fast, ok := parseFast(t); ok {
		return fast, fast.Validate()
	}
	return parseFull(t)
}

// parseFull reads trimmed properties JSON with encoding/json: any JSON,
// and the error that names what is wrong with it.
func parseFull(t []byte) (Properties, error) {
	var p Properties
	// encoding/json matches field names regardless of case; the contract's
	// names are exact (other languages' producers check them so).
	var names map[string]json.RawMessage
	if err := json.Unmarshal(t, &names); err == nil {
		for _, n := range sortedKeys(names) {
			if !knownProperty[n] {
				return p, fmt.Errorf("properties: unknown field %q", n)
			}
		}
	}
	d := json.NewDecoder(bytes.NewReader(t))
	d.DisallowUnknownFields()
	d.UseNumber()
	if err := d.Decode(&p); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return p, fmt.Errorf("properties: field %q: a JSON %s where a %s goes", te.Field, te.Value, te.Type)
		}
		if s, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return p, fmt.Errorf("properties: unknown field %s", s)
		}
		return p, fmt.Errorf("properties are not valid JSON: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return p, errors.New("properties: data after the JSON object")
	}
	return p, p.Validate()
}

var knownProperty = map[string]bool{"routing_key": true, "headers": true, "content_type": true,
	"content_encoding": true, "correlation_id": true, "reply_to": true, "type": true, "priority": true,
	"expiration_ms": true, "deadline_ms": true, "message_id": true, "amqp_headers": true}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Marshal encodes validated properties as the contract's JSON object.
func (p Properties) Marshal() ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err == nil && len(b) > MaxPropertiesBytes {
		err = fmt.Errorf("properties are %d bytes, over %d", len(b), MaxPropertiesBytes)
	}
	return b, err
}

// IsZero reports whether p sets nothing (no props entry is written then).
func (p Properties) IsZero() bool {
	return p.RoutingKey == "" && len(p.Headers) == 0 && p.ContentType == "" && p.ContentEncoding == "" &&
		p.CorrelationID == "" && p.ReplyTo == "" && p.Type == "" && p.Priority == nil &&
		p.ExpirationMs == nil && p.DeadlineMs == nil && p.MessageID == "" && len(p.AMQPHeaders) == 0
}

// HeaderCarrier lets a trace propagator write into the headers: it has
// the methods of OpenTelemetry's propagation.TextMapCarrier, so
// otel.GetTextMapPropagator().Inject(ctx, props.Carrier()) puts the
// current span's traceparent and tracestate there, without this package
// depending on OpenTelemetry.
type HeaderCarrier struct{ p *Properties }

// Carrier returns p's headers as a trace-context carrier.
func (p *Properties) Carrier() HeaderCarrier { return HeaderCarrier{p} }

// Get returns a string header, or "".
func (c HeaderCarrier) Get(key string) string {
	s, _ := c.p.Headers[key].(string)
	return s
}

// Set sets a string header.
func (c HeaderCarrier) Set(key, value string) {
	if c.p.Headers == nil {
		c.p.Headers = map[string]any{}
	}
	c.p.Headers[key] = value
}

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	out := make([]string, 0, len(c.p.Headers))
	for k := range c.p.Headers {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
