package shard

import (
	"strconv"
	"strings"
)

// Messages on a queue's Wake channel. They only hurry dispatchers up:
// one that is lost costs at most a poll interval, never a task.
const (
	// WakeBusy: an instance found a backlog; every instance helps drain it.
	WakeBusy = "busy"
	// WakeLead: the sweeping instance stepped down; another should take over.
	WakeLead = "lead"
	// WakeLayout: the queue's shard count is changing or has changed
	// (`dispatcher reshard`); every instance reads the layout again.
	WakeLayout = "layout"
)

// WakeDue is the message a producer sends after scheduling a task on shard
// i due at dueMs, so the sweeping instance need not wait for its next poll.
func WakeDue(i int, dueMs int64) string {
	return "due:" + strconv.Itoa(i) + ":" + strconv.FormatInt(dueMs, 10)
}

// ParseWakeDue reads a WakeDue message.
func ParseWakeDue(msg string) (i int, dueMs int64, ok bool) {
	rest, ok := strings.CutPrefix(msg, "due:")
	if !ok {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(rest, ":")
	if !ok {
		return 0, 0, false
	}
	i, err1 := strconv.Atoi(a)
	dueMs, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || i < 0 || i >= MaxShards {
		return 0, 0, false
	}
	return i, dueMs, true
}
