package redisconn

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWatcherLogsOutage stops a private redis-server and starts it again:
// one line when it is lost, one when it is back with how long it was out,
// and nothing while it stays up or stays down.
func TestWatcherLogsOutage(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb, err := Open(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var buf syncBuf
	w := &Watcher{Client: rdb, Interval: 50 * time.Millisecond, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	wait := func(s string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(buf.String(), s) {
			if time.Now().After(deadline) {
				t.Fatalf("not logged: %q; log:\n%s", s, buf.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if buf.String() != "" {
		t.Fatalf("logged while Redis is up:\n%s", buf.String())
	}
	srv.Kill()
	wait("lost Redis")
	time.Sleep(time.Second)
	srv.Restart()
	wait("Redis is back")
	time.Sleep(300 * time.Millisecond)
	out := buf.String()
	if strings.Count(out, "lost Redis") != 1 || strings.Count(out, "Redis is back") != 1 {
		t.Fatalf("want one line each way:\n%s", out)
	}
	back := out[strings.Index(out, "Redis is back"):]
	i := strings.Index(back, "down_for=")
	if i < 0 {
		t.Fatalf("no down_for: %s", back)
	}
	d, err := time.ParseDuration(strings.Fields(back[i+len("down_for="):])[0])
	if err != nil || d < time.Second || d > 10*time.Second {
		t.Errorf("down_for %v (%v), want the outage's length, over 1s", d, err)
	}
	if !strings.Contains(out, "redis="+srv.Addr()) {
		t.Errorf("the lines do not name the server:\n%s", out)
	}
}
