package main

import (
	"context"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/recurring"
	"github.com/dispatcher/dispatcher/shard"
)

// TestRecurringAddProperties: recurring add --props (with --header,
// --routing-key, --content-type merged in) stores the schedule's
// properties; bad ones, deadline_ms, a field given twice or a malformed
// --header are refused (exit 2) naming the field, and nothing is stored.
func TestRecurringAddProperties(t *testing.T) {
	prefix, rdb := cliEnv(t, map[string]string{"DISPATCHER_QUEUES": "q", "DISPATCHER_QUEUE_Q_SHARDS": "2", "DISPATCHER_QUEUE_Q_EXCHANGE": "x"})
	recordShards(t, rdb, prefix, "q", 2)
	add := func(args ...string) (string, int) {
		t.Helper()
		_, errOut, code := runCLI(t, append([]string{"recurring", "add", "--queue", "q", "--cron", "@hourly"}, args...)...)
		return errOut, code
	}
	if errOut, code := add("--name", "a", "--props", `{"priority": 4, "headers": {"n": 1}}`, "--header", "tenant=acme", "--routing-key", "rk", "--content-type", "text/plain", "tick"); code != exitOK {
		t.Fatalf("recurring add --props: exit %d %q", code, errOut)
	}
	defs, _, err := recurring.NewStore(rdb, shard.Keys{Prefix: prefix, Queue: "q"}).Defs(context.Background())
	if err != nil || len(defs) != 1 || defs[0].Properties != `{"content_type":"text/plain","headers":{"n":1,"tenant":"acme"},"priority":4,"routing_key":"rk"}` {
		t.Fatalf("stored: %+v, %v", defs, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--props", `{"priority": 256}`}, "priority 256"},
		{[]string{"--props", `{"colour": "red"}`}, `unknown field "colour"`},
		{[]string{"--props", `{"deadline_ms": 1900000000000}`}, "deadline_ms"},
		{[]string{"--props", `{"routing_key": "a"}`, "--routing-key", "b"}, "--routing-key: routing_key is given in --props too"},
		{[]string{"--header", "novalue"}, `--header "novalue": want NAME=VALUE`},
		{[]string{"--header", "x-task-id=1"}, `"x-task-id" is reserved`},
	} {
		errOut, code := add(append([]string{"--name", "b"}, append(c.args, "tock")...)...)
		if code != exitSettings || !strings.Contains(errOut, c.want) {
			t.Errorf("recurring add %v: exit %d %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	if defs, _, _ := recurring.NewStore(rdb, shard.Keys{Prefix: prefix, Queue: "q"}).Defs(context.Background()); len(defs) != 1 {
		t.Errorf("%d schedules stored, want 1: the refused ones were saved", len(defs))
	}
}
