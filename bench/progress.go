package bench

import (
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// progress writes a status line to stderr about once a second while a
// phase runs, so a long run shows that it is alive and how far it got.
type progress struct {
	w     io.Writer
	every time.Duration
	mu    sync.Mutex // one writer at a time
}

// start prints line() every interval until the returned stop is called;
// stop may be called more than once.
func (p *progress) start(line func() string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(finished)
		t := time.NewTicker(p.every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.printf("  %s  [%.0fs]\n", line(), time.Since(begin).Seconds())
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done); <-finished })
	}
}

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// thousands writes n with ',' between groups of three digits.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3)
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
