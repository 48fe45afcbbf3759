package shard

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// parseFast reads properties JSON in one pass over its bytes, for the
// shapes producers write: known field names, strings without escapes,
// integers, and headers of strings, integers and booleans. It is what
// every task with properties costs an instance at publish, where
// encoding/json's two passes (the exact names, then the typed decode)
// were a quarter of the CPU of draining a backlog of such tasks.
//
// ok is false for anything else (an escape, a fraction or exponent, null,
// a name twice, an unknown name, bad JSON): the full parser then decides,
// with its error. What it accepts it reads as the full parser does
// (FuzzParseFast holds the two to that); t is trimmed already.
func parseFast(t []byte) (p Properties, ok bool) {
	l := lexer{b: t}
	if !l.next('{') {
		return p, false
	}
	var seen uint16
	if !l.next('}') {
		for {
			name, ok := l.str()
			if !ok || !l.next(':') {
				return p, false
			}
			bit, ok := fastField[name]
			if !ok || seen&bit != 0 {
				return p, false
			}
			seen |= bit
			if !l.field(&p, name) {
				return p, false
			}
			if l.next(',') {
				continue
			}
			if !l.next('}') {
				return p, false
			}
			break
		}
	}
	l.ws()
	return p, l.i == len(l.b)
}

// fastField gives each field name a bit, to find a name written twice.
var fastField = map[string]uint16{"routing_key": 1, "headers": 2, "content_type": 4, "content_encoding": 8,
	"correlation_id": 16, "reply_to": 32, "type": 64, "priority": 128, "expiration_ms": 256,
	"deadline_ms": 512, "message_id": 1024, "amqp_headers": 2048}

// lexer walks JSON bytes: i is the next byte to read.
type lexer struct {
	b []byte
	i int
}

// field reads the value of the field name into p.
func (l *lexer) field(p *Properties, name string) bool {
	var s *string
	switch name {
	case "routing_key":
		s = &p.RoutingKey
	case "content_type":
		s = &p.ContentType
	case "content_encoding":
		s = &p.ContentEncoding
	case "correlation_id":
		s = &p.CorrelationID
	case "reply_to":
		s = &p.ReplyTo
	case "type":
		s = &p.Type
	case "message_id":
		s = &p.MessageID
	case "priority":
		n, ok := l.int()
		if !ok || n != int64(int(n)) {
			return false
		}
		v := int(n)
		p.Priority = &v
		return true
	case "expiration_ms", "deadline_ms":
		n, ok := l.int()
		if !ok {
			return false
		}
		if name == "expiration_ms" {
			p.ExpirationMs = &n
		} else {
			p.DeadlineMs = &n
		}
		return true
	case "headers":
		return l.headers(p)
	case "amqp_headers":
		raw, ok := l.object()
		if !ok {
			return false
		}
		p.AMQPHeaders = append(json.RawMessage(nil), raw...)
		return true
	}
	v, ok := l.str()
	*s = v
	return ok
}

// headers reads an object of strings, integers and booleans.
func (l *lexer) headers(p *Properties) bool {
	if !l.next('{') {
		return false
	}
	p.Headers = map[string]any{}
	if l.next('}') {
		return true
	}
	for {
		name, ok := l.str()
		if !ok || !l.next(':') {
			return false
		}
		if _, dup := p.Headers[name]; dup {
			return false
		}
		l.ws()
		if l.i >= len(l.b) {
			return false
		}
		switch c := l.b[l.i]; {
		case c == '"':
			v, ok := l.str()
			if !ok {
				return false
			}
			p.Headers[name] = v
		case c == 't' || c == 'f':
			v, ok := l.boolean()
			if !ok {
				return false
			}
			p.Headers[name] = v
		default:
			n, ok := l.int()
			if !ok {
				return false
			}
			p.Headers[name] = n
		}
		if l.next(',') {
			continue
		}
		return l.next('}')
	}
}

// ws skips JSON's whitespace.
func (l *lexer) ws() {
	for l.i < len(l.b) {
		switch l.b[l.i] {
		case ' ', '\t', '\n', '\r':
			l.i++
		default:
			return
		}
	}
}

// next reads c if it comes next.
func (l *lexer) next(c byte) bool {
	l.ws()
	if l.i < len(l.b) && l.b[l.i] == c {
		l.i++
		return true
	}
	return false
}

// str reads a string without escapes, of valid UTF-8 (encoding/json
// replaces what is not: the full parser does that).
func (l *lexer) str() (string, bool) {
	if !l.next('"') {
		return "", false
	}
	ascii := true
	for j := l.i; j < len(l.b); j++ {
		switch c := l.b[j]; {
		case c == '"':
			s := l.b[l.i:j]
			if !ascii && !utf8.Valid(s) {
				return "", false
			}
			l.i = j + 1
			return string(s), true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", false
}

// int reads an integer in int64's range, written without a fraction or
// an exponent.
func (l *lexer) int() (int64, bool) {
	l.ws()
	start := l.i
	if l.i < len(l.b) && l.b[l.i] == '-' {
		l.i++
	}
	digits := l.i
	for l.i < len(l.b) && l.b[l.i] >= '0' && l.b[l.i] <= '9' {
		l.i++
	}
	n := l.i - digits
	if n == 0 || (n > 1 && l.b[digits] == '0') {
		return 0, false
	}
	if l.i < len(l.b) {
		if c := l.b[l.i]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(string(l.b[start:l.i]), 10, 64)
	return v, err == nil
}

// boolean reads true or false.
func (l *lexer) boolean() (bool, bool) {
	for _, lit := range [...]string{"true", "false"} {
		if len(l.b)-l.i >= len(lit) && string(l.b[l.i:l.i+len(lit)]) == lit {
			l.i += len(lit)
			return lit == "true", true
		}
	}
	return false, false
}

// object reads a JSON object whole and returns its bytes: it finds the
// end by its brackets, strings skipped, and then has encoding/json check
// it (amqp_headers is typed JSON, read at publish by internal/amqptable).
func (l *lexer) object() ([]byte, bool) {
	l.ws()
	if l.i >= len(l.b) || l.b[l.i] != '{' {
		return nil, false
	}
	start, depth, inStr := l.i, 0, false
	for j := l.i; j < len(l.b); j++ {
		c := l.b[j]
		if inStr {
			switch c {
			case '\\':
				j++
			case '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				raw := l.b[start : j+1]
				if !json.Valid(raw) {
					return nil, false
				}
				l.i = j + 1
				return raw, true
			}
		}
	}
	return nil, false
}
