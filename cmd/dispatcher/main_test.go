package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestHelpListsEverySetting(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, v := range []string{"DISPATCHER_REDIS_URL", "DISPATCHER_AMQP_URL", "DISPATCHER_KEY_PREFIX", "DISPATCHER_QUEUES",
		"DISPATCHER_LEASE", "DISPATCHER_HTTP_ADDR", "DISPATCHER_QUEUE_<NAME>_SHARDS", "DISPATCHER_QUEUE_<NAME>_EXCHANGE",
		"DISPATCHER_QUEUE_<NAME>_ROUTING_KEY"} {
		if !strings.Contains(out.String(), v) {
			t.Errorf("--help lacks %s", v)
		}
	}
	if strings.Contains(out.String(), "guest:guest") {
		t.Error("--help shows a password")
	}
}

func TestUnknownArgument(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--frobnicate"}, &out, &errOut); code != exitSettings || !strings.Contains(errOut.String(), "--frobnicate") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}
