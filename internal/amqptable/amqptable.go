// Package amqptable writes AMQP header tables as typed JSON and reads them
// back, so that a task's stored properties (field amqp_headers, see
// CONTRACT.md) keep every AMQP table type: nested tables, arrays, floats,
// decimals, timestamps, byte arrays and integers of each width.
package amqptable

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// typed is one value: t names the AMQP type, v holds it.
type typed struct {
	T string          `json:"t"`
	V json.RawMessage `json:"v,omitempty"`
}

type decimal struct {
	Scale uint8 `json:"scale"`
	Value int32 `json:"value"`
}

// Encode writes t as a JSON object of typed values.
func Encode(t amqp.Table) (json.RawMessage, error) {
	m, err := encodeTable(t, "")
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func encodeTable(t amqp.Table, path string) (map[string]typed, error) {
	out := make(map[string]typed, len(t))
	for k, v := range t {
		e, err := encodeValue(v, path+k)
		if err != nil {
			return nil, err
		}
		out[k] = e
	}
	return out, nil
}

func raw(v any) json.RawMessage { b, _ := json.Marshal(v); return b }

func encodeValue(v any, path string) (typed, error) {
	switch v := v.(type) {
	case nil:
		return typed{T: "void"}, nil
	case string:
		return typed{"str", raw(v)}, nil
	case bool:
		return typed{"bool", raw(v)}, nil
	case int8:
		return typed{"i8", raw(v)}, nil
	case int16:
		return typed{"i16", raw(v)}, nil
	case int32:
		return typed{"i32", raw(v)}, nil
	case int64:
		return typed{"i64", raw(v)}, nil
	case int:
		return typed{"i64", raw(v)}, nil
	case uint8:
		return typed{"u8", raw(v)}, nil
	case uint16:
		return typed{"u16", raw(v)}, nil
	case uint32:
		return typed{"u32", raw(v)}, nil
	case float32:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return typed{}, fmt.Errorf("header %q is %v: JSON holds no NaN or infinity", path, v)
		}
		return typed{"f32", raw(v)}, nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return typed{}, fmt.Errorf("header %q is %v: JSON holds no NaN or infinity", path, v)
		}
		return typed{"f64", raw(v)}, nil
	case amqp.Decimal:
		return typed{"dec", raw(decimal{v.Scale, v.Value})}, nil
	case time.Time:
		return typed{"ts", raw(v.Unix())}, nil
	case []byte:
		return typed{"bytes", raw(base64.StdEncoding.EncodeToString(v))}, nil
	case []any:
		a := make([]typed, len(v))
		for i, x := range v {
			e, err := encodeValue(x, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return typed{}, err
			}
			a[i] = e
		}
		return typed{"arr", raw(a)}, nil
	case amqp.Table:
		m, err := encodeTable(v, path+".")
		if err != nil {
			return typed{}, err
		}
		return typed{"table", raw(m)}, nil
	}
	return typed{}, fmt.Errorf("header %q is %v (%T): not an AMQP table type", path, v, v)
}

// Decode reads what Encode wrote back into an amqp.Table of the same types.
func Decode(b []byte) (amqp.Table, error) {
	var m map[string]typed
	if err := strict(b, &m); err != nil {
		return nil, fmt.Errorf("amqp_headers: %w", err)
	}
	return decodeTable(m, "")
}

func strict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func decodeTable(m map[string]typed, path string) (amqp.Table, error) {
	t := make(amqp.Table, len(m))
	for k, e := range m {
		v, err := decodeValue(e, path+k)
		if err != nil {
			return nil, err
		}
		t[k] = v
	}
	return t, nil
}

func decodeValue(e typed, path string) (any, error) {
	var err error
	var v any
	switch e.T {
	case "void":
		return nil, nil
	case "str":
		var s string
		err, v = json.Unmarshal(e.V, &s), &s
	case "bool":
		var x bool
		err, v = json.Unmarshal(e.V, &x), &x
	case "i8":
		var x int8
		err, v = json.Unmarshal(e.V, &x), &x
	case "i16":
		var x int16
		err, v = json.Unmarshal(e.V, &x), &x
	case "i32":
		var x int32
		err, v = json.Unmarshal(e.V, &x), &x
	case "i64":
		var x int64
		err, v = json.Unmarshal(e.V, &x), &x
	case "u8":
		var x uint8
		err, v = json.Unmarshal(e.V, &x), &x
	case "u16":
		var x uint16
		err, v = json.Unmarshal(e.V, &x), &x
	case "u32":
		var x uint32
		err, v = json.Unmarshal(e.V, &x), &x
	case "f32":
		var x float32
		err, v = json.Unmarshal(e.V, &x), &x
	case "f64":
		var x float64
		err, v = json.Unmarshal(e.V, &x), &x
	case "dec":
		var d decimal
		if err = strict(e.V, &d); err == nil {
			return amqp.Decimal{Scale: d.Scale, Value: d.Value}, nil
		}
	case "ts":
		var s int64
		if err = json.Unmarshal(e.V, &s); err == nil {
			return time.Unix(s, 0).UTC(), nil
		}
	case "bytes":
		var s string
		if err = json.Unmarshal(e.V, &s); err == nil {
			return base64.StdEncoding.DecodeString(s)
		}
	case "arr":
		var a []typed
		if err = json.Unmarshal(e.V, &a); err == nil {
			out := make([]any, len(a))
			for i, x := range a {
				if out[i], err = decodeValue(x, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return nil, err
				}
			}
			return out, nil
		}
	case "table":
		var m map[string]typed
		if err = json.Unmarshal(e.V, &m); err == nil {
			return decodeTable(m, path+".")
		}
	default:
		return nil, fmt.Errorf("amqp_headers: %q has unknown type %q", path, e.T)
	}
	if err != nil {
		return nil, fmt.Errorf("amqp_headers: %q of type %s: %w", path, e.T, err)
	}
	switch x := v.(type) { // dereference what was decoded into
	case *string:
		return *x, nil
	case *bool:
		return *x, nil
	case *int8:
		return *x, nil
	case *int16:
		return *x, nil
	case *int32:
		return *x, nil
	case *int64:
		return *x, nil
	case *uint8:
		return *x, nil
	case *uint16:
		return *x, nil
	case *uint32:
		return *x, nil
	case *float32:
		return *x, nil
	case *float64:
		return *x, nil
	}
	return v, nil
}
