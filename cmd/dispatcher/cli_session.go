package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/admin"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// session is what a command works with: its settings and Redis.
type session struct {
	cfg    *config.Settings
	rdb    redis.UniversalClient
	stdout io.Writer
	json   bool
}

// openSession loads the commands' settings (see config.LoadTool; queues
// are those the command names) and opens Redis. Settings errors exit 2.
func openSession(s streams, asJSON bool, queues ...string) (*session, error) {
	cfg, err := config.LoadTool(queues...)
	if err != nil {
		return nil, settingsError(err)
	}
	ropt, err := redisOptions(cfg)
	if err != nil {
		return nil, settingsError(err)
	}
	redis.SetLogger(redisconn.Quiet{})
	return &session{cfg: cfg, rdb: ropt.NewClient(), stdout: s.stdout, json: asJSON}, nil
}

func (se *session) close() { se.rdb.Close() }

// redisFailure is a failed Redis call: exit 1, naming the server.
func (se *session) redisFailure(err error) error {
	return failure(fmt.Errorf("%s: %v", redact.URL(se.cfg.RedisURL), redact.Error(err)))
}

// queue checks name and returns its settings, the shard count resolved:
// the one recorded in Redis at P:{Q}:shards, or
// DISPATCHER_QUEUE_<NAME>_SHARDS, which must then agree with it. With
// record, a count configured but not yet recorded is recorded, as the
// daemon does.
func (se *session) queue(ctx context.Context, name string, record bool) (config.Queue, error) {
	if name == "" {
		return config.Queue{}, usageErrorf("--queue is required")
	}
	if !shard.ValidQueueName(name) {
		return config.Queue{}, usageErrorf("--queue %q: want 1 to 64 characters of A-Z a-z 0-9 _ . -", name)
	}
	if len(se.cfg.Queues) > 0 && !slices.Contains(se.cfg.Queues, name) {
		return config.Queue{}, usageErrorf("--queue %q: not one of DISPATCHER_QUEUES (%s)", name, strings.Join(se.cfg.Queues, ", "))
	}
	q, _ := se.cfg.Queue(name)
	q.Name = name
	keys := shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: name}
	recorded, err := recordedShards(ctx, se.rdb, keys)
	if err != nil {
		return q, se.redisFailure(err)
	}
	envVar := config.QueuePrefix(name) + "_SHARDS"
	switch {
	case recorded == 0 && q.Shards == 0:
		return q, settingsError(fmt.Errorf("queue %s: no shard count recorded at %s (no dispatcher has served it) and %s is not set",
			name, keys.ShardCount(), envVar))
	case recorded == 0 && record:
		if err := shard.EnsureShardCount(ctx, se.rdb, keys, q.Shards); err != nil {
			var sce *shard.ShardCountError
			if errors.As(err, &sce) { // recorded meanwhile
				return q, settingsError(fmt.Errorf("%w (%s=%d)", err, envVar, q.Shards))
			}
			return q, se.redisFailure(err)
		}
	case recorded == 0:
	case q.Shards == 0:
		q.Shards = recorded
	case q.Shards != recorded:
		err := &shard.ShardCountError{Queue: name, Recorded: recorded, Configured: q.Shards}
		return q, settingsError(fmt.Errorf("%w (%s=%d)", err, envVar, q.Shards))
	}
	return q, nil
}

// recordedShards reads the shard count recorded for a queue; 0 if none.
func recordedShards(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys) (int, error) {
	got, err := rdb.Get(ctx, keys.ShardCount()).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read shard count at %s: %w", keys.ShardCount(), err)
	}
	n, err := strconv.Atoi(got)
	if err != nil || n < 1 || n > shard.MaxShards {
		return 0, fmt.Errorf("shard count at %s is %q, not 1 to %d", keys.ShardCount(), got, shard.MaxShards)
	}
	return n, nil
}

// adminQueue is the queue as package admin addresses it.
func (se *session) adminQueue(q config.Queue) admin.Queue {
	return admin.Queue{Keys: shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: q.Name}, Shards: q.Shards}
}

// print writes v as JSON with --json, else calls human.
func (se *session) print(v any, human func(w io.Writer)) {
	if se.json {
		enc := json.NewEncoder(se.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
		return
	}
	human(se.stdout)
}

// readBody is a task body given as an argument; "-" reads it from stdin,
// up to limit bytes (one more tells it is over), dropping one trailing
// newline ("\n" or "\r\n") unless raw: echo and a here-string add one, and
// the body typed on a command line has none.
func readBody(arg string, stdin io.Reader, limit int, raw bool) ([]byte, error) {
	if arg != "-" {
		return []byte(arg), nil
	}
	b, err := io.ReadAll(io.LimitReader(stdin, int64(limit)+1))
	if err != nil {
		return nil, failure(fmt.Errorf("read the body from stdin: %w", err))
	}
	if !raw && len(b) <= limit {
		if bytes.HasSuffix(b, []byte("\r\n")) {
			b = b[:len(b)-2]
		} else {
			b = bytes.TrimSuffix(b, []byte("\n"))
		}
	}
	return b, nil
}
