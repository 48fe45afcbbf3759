package shard_test

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine must have a stop signal and someone who waits for it. The
// shard module depends on go-redis and xxhash alone, so this is a small
// check of its own rather than go.uber.org/goleak.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := goroutinesLeft(5 * time.Second); left != "" {
			fmt.Fprintf(os.Stderr, "goroutine leak: goroutines outlived the tests:\n%s\n", left)
			code = 1
		}
	}
	os.Exit(code)
}

// goroutinesLeft waits up to timeout for every goroutine but this one to
// end (a closed client's goroutines take a moment) and returns the stacks
// of those still running, or "".
func goroutinesLeft(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		left := otherGoroutines()
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return string(bytes.Join(left, []byte("\n\n")))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// otherGoroutines returns the stacks of the goroutines other than the
// caller's, leaving out the runtime's signal handler (started by
// os/signal, which lives as long as the process).
func otherGoroutines() [][]byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out [][]byte
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 || bytes.Contains(g, []byte("os/signal.signal_recv")) || bytes.Contains(g, []byte("os/signal.loop")) {
			continue // the first is the caller's own
		}
		out = append(out, g)
	}
	return out
}
