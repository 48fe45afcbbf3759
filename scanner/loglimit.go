package scanner

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter logs a recurring problem once per interval per key, with the
// number of repeats it held back, so that a broken shard polled every few
// milliseconds does not flood the log.
type logLimiter struct {
	log      *slog.Logger
	interval time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

func newLogLimiter(log *slog.Logger, interval time.Duration) *logLimiter {
	return &logLimiter{log: log, interval: interval, last: map[string]time.Time{}, held: map[string]int{}}
}

// allow reports whether key may be logged now, and how many were held back.
func (l *logLimiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.interval {
		l.held[key]++
		return false, 0
	}
	n := l.held[key]
	l.last[key] = now
	delete(l.held, key)
	return true, n
}

func (l *logLimiter) emit(level slog.Level, key, msg string, args ...any) {
	ok, held := l.allow(key, time.Now())
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "repeats_not_logged", held)
	}
	l.log.Log(context.Background(), level, msg, args...)
}

func (l *logLimiter) Info(key, msg string, args ...any)  { l.emit(slog.LevelInfo, key, msg, args...) }
func (l *logLimiter) Warn(key, msg string, args ...any)  { l.emit(slog.LevelWarn, key, msg, args...) }
func (l *logLimiter) Error(key, msg string, args ...any) { l.emit(slog.LevelError, key, msg, args...) }
