package redisconn

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redact"
)

// Watcher logs the outages of Redis for the whole process: one line when
// a primary stops answering PING and one when it answers again, with how
// long it was out. The scan loops retry on their own and log their
// failures per queue, rate-limited; without this nothing said that Redis
// was back, nor for how long it had been gone.
type Watcher struct {
	Client   redis.UniversalClient
	Interval time.Duration // between rounds of PINGs; default 1s
	Timeout  time.Duration // for one round; default 2s
	Logger   *slog.Logger
	Now      func() time.Time // default time.Now

	down map[string]time.Time // addr ("" for all of Redis) -> lost since
}

// Run pings every primary each Interval until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	if w.Interval <= 0 {
		w.Interval = time.Second
	}
	if w.Timeout <= 0 {
		w.Timeout = 2 * time.Second
	}
	if w.Now == nil {
		w.Now = time.Now
	}
	if w.Logger == nil {
		w.Logger = slog.Default()
	}
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res := w.round(ctx)
		if ctx.Err() != nil {
			return
		}
		w.note(res)
	}
}

// round asks every primary for PING: the error of each, by address; ""
// when not even the primaries could be listed (a cluster's slot map).
func (w *Watcher) round(ctx context.Context) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, w.Timeout)
	defer cancel()
	var mu sync.Mutex
	res := map[string]error{}
	err := ForEachPrimary(ctx, w.Client, func(ctx context.Context, addr string, c *redis.Client) error {
		perr := c.Ping(ctx).Err()
		mu.Lock()
		defer mu.Unlock()
		res[addr] = perr
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(res) == 0 && err != nil {
		res[""] = err
	}
	return res
}

// note logs the changes a round shows.
func (w *Watcher) note(res map[string]error) {
	if w.down == nil {
		w.down = map[string]time.Time{}
	}
	now := w.Now()
	addrs := make([]string, 0, len(res))
	all := true
	for addr, err := range res {
		addrs = append(addrs, addr)
		all = all && err == nil
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		err := res[addr]
		_, wasDown := w.down[addr]
		switch {
		case err != nil && !wasDown:
			w.down[addr] = now
			w.Logger.Warn("lost Redis: dispatching waits until it answers", w.where(addr, "err", redact.Error(err))...)
		case err == nil && wasDown:
			w.back(addr, now)
		}
	}
	// Every primary answers: one that is gone from the list (replaced in a
	// failover), or all of Redis when it could not be listed, is back too.
	if all {
		for addr := range w.down {
			w.back(addr, now)
		}
	}
}

func (w *Watcher) back(addr string, now time.Time) {
	w.Logger.Info("Redis is back", w.where(addr, "down_for", now.Sub(w.down[addr]).Round(time.Millisecond))...)
	delete(w.down, addr)
}

func (w *Watcher) where(addr string, args ...any) []any {
	if addr == "" {
		return args
	}
	return append([]any{"redis", addr}, args...)
}
