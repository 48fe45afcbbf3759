package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestTailShowsIDAndProperties: tail prints a task's id (x-task-id) and
// the properties it set (AMQP properties, headers but the dispatcher's
// own), as a line and in --json; a task without any shows neither.
func TestTailShowsIDAndProperties(t *testing.T) {
	cliEnv(t, map[string]string{"DISPATCHER_AMQP_URL": testenv.AMQPURL(t)})
	exchange := testenv.Name(t)
	conn := testenv.AMQP(t)
	testenv.Consumer(t, conn, exchange, "jobs") // declares the exchange
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	due := time.Now().UnixMilli()
	withID := amqp.Publishing{MessageId: "m-1", Body: []byte("hi"), ContentType: "text/plain", Priority: 3, Expiration: "60000", CorrelationId: "c-1",
		Headers: amqp.Table{"x-due-ms": due, "x-task-id": "order-42", "x-published-us": int64(1), "tenant": "acme", "n": int32(7)}}
	plain := amqp.Publishing{MessageId: "m-2", Body: []byte("plain"), Headers: amqp.Table{"x-due-ms": due}}
	for _, asJSON := range []bool{false, true} {
		args := []string{"tail", "--queue", "jobs", "--exchange", exchange, "--count", "2", "--timeout", "20s"}
		if asJSON {
			args = append(args, "--json")
		}
		var out, errOut lockedBuffer
		done := make(chan int)
		go func() { done <- runWith(args, nil, &out, &errOut) }()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(errOut.String(), "waiting for tasks"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("tail did not bind: %q", errOut.String())
			}
		}
		for _, p := range []amqp.Publishing{withID, plain} {
			if err := ch.Publish(exchange, "jobs", false, false, p); err != nil {
				t.Fatal(err)
			}
		}
		if code := <-done; code != exitOK {
			t.Fatalf("tail: exit %d %q", code, errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("tail printed %d lines:\n%s", len(lines), out.String())
		}
		if !asJSON {
			want := ` id="order-42" properties={"content_type":"text/plain","correlation_id":"c-1","expiration_ms":60000,"headers":{"n":7,"tenant":"acme"},"priority":3} body="hi"`
			if !strings.Contains(lines[0], want) || strings.Contains(lines[1], " id=") || strings.Contains(lines[1], "properties=") {
				t.Errorf("tail:\n%s\nwant the first line with %s", out.String(), want)
			}
			continue
		}
		var a, b map[string]any
		if json.Unmarshal([]byte(lines[0]), &a) != nil || json.Unmarshal([]byte(lines[1]), &b) != nil {
			t.Fatalf("tail --json:\n%s", out.String())
		}
		props, _ := json.Marshal(a["properties"])
		if a["id"] != "order-42" || a["body"] != "hi" ||
			string(props) != `{"content_type":"text/plain","correlation_id":"c-1","expiration_ms":60000,"headers":{"n":7,"tenant":"acme"},"priority":3}` ||
			b["id"] != nil || b["properties"] != nil || b["body"] != "plain" {
			t.Errorf("tail --json:\n%s", out.String())
		}
	}
}
