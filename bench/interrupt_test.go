package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// lockedBuffer is a bytes.Buffer safe to read while Main writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Issue 22 item 10: a run stopped with Ctrl-C leaves the -json and -svg
// files as they were (a tracked report, say), and says so.
func TestBenchInterruptedKeepsReports(t *testing.T) {
	dir := t.TempDir()
	jsonPath, svgPath := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.svg")
	const tracked = "the tracked report\n"
	for _, p := range []string{jsonPath, svgPath} {
		if err := os.WriteFile(p, []byte(tracked), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr lockedBuffer
	done := make(chan int)
	go func() {
		done <- Main([]string{"-redis", testenv.RedisURL(t), "-amqp", testenv.AMQPURL(t), "-dispatcher", binary,
			"-mode", "rate", "-rate", "200", "-duration", "60s", "-instances", "1", "-shards", "4",
			"-json", jsonPath, "-svg", svgPath}, &stdout, &stderr)
	}()
	// Main catches SIGINT from its start: interrupt once the point runs.
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), "[1/1]") {
		if time.Now().After(deadline) {
			t.Fatalf("the point did not start:\n%s", stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var code int
	select {
	case code = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("bench did not stop on SIGINT")
	}
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	for _, p := range []string{jsonPath, svgPath} {
		if b, _ := os.ReadFile(p); string(b) != tracked {
			t.Errorf("%s was replaced by an interrupted run (%d bytes: %.80q)", filepath.Base(p), len(b), b)
		}
	}
	if !strings.Contains(stderr.String(), "not written") {
		t.Errorf("stderr does not say the files were not written:\n%s", stderr.String())
	}
}
