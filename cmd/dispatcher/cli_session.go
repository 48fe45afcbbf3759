package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/admin"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// session is what a command works with: its settings and Redis.
type session struct {
	cfg     *config.Settings
	rdb     redis.UniversalClient
	stdout  io.Writer
	stderr  io.Writer
	json    bool
	layouts map[string]shard.Layout // read by queue
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
	rdb := ropt.NewClient()
	// Settings Redis refuses (a wrong password, a database it lacks) are
	// bad settings, said as the daemon says them; other trouble is left to
	// the command, which reports what it could not do.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var refused *redisconn.RefusedError
	if err := redisconn.Check(ctx, rdb); errors.As(err, &refused) {
		rdb.Close()
		return nil, settingsError(redisRefusal(cfg, refused))
	}
	return &session{cfg: cfg, rdb: rdb, stdout: s.stdout, stderr: s.stderr, json: asJSON}, nil
}

func (se *session) close() { se.rdb.Close() }

// openQueues is openSession for a command over several queues, with
// their names (queueNames) and a context of timeout, which done ends with
// the session.
func openQueues(cmd *cobra.Command, s streams, asJSON bool, given []string, timeout time.Duration) (
	se *session, ctx context.Context, names []string, done func(), err error) {
	if se, err = openSession(s, asJSON, given...); err != nil {
		return nil, nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	done = func() { cancel(); se.close() }
	if names, err = se.queueNames(ctx, given); err != nil {
		done()
		return nil, nil, nil, nil, err
	}
	return se, ctx, names, done, nil
}

// queueNames are the queues a command over several works on: those
// given, else DISPATCHER_QUEUES, else every queue recorded in Redis.
func (se *session) queueNames(ctx context.Context, given []string) ([]string, error) {
	if len(given) > 0 {
		return given, nil
	}
	if len(se.cfg.Queues) > 0 {
		return se.cfg.Queues, nil
	}
	names, err := recordedQueues(ctx, se.rdb, se.cfg.KeyPrefix)
	if err != nil {
		if redisconn.Permanent(err) {
			// Most likely an ACL without SCAN, which only this needs.
			err = fmt.Errorf("finding the queues recorded in Redis needs SCAN: grant +scan, or name the queues with --queue or DISPATCHER_QUEUES: %w", err)
		}
		return nil, se.redisFailure(err)
	}
	return names, nil
}

// openQueue is openSession for a command on one queue: it resolves the
// queue (session.queue, recording a configured count not yet recorded)
// under a context of timeout, which done ends with the session.
func openQueue(cmd *cobra.Command, s streams, asJSON bool, queue string, timeout time.Duration) (
	se *session, q config.Queue, ctx context.Context, done func(), err error) {
	if se, err = openSession(s, asJSON, queue); err != nil {
		return nil, q, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	done = func() { cancel(); se.close() }
	if q, err = se.queue(ctx, queue, true); err != nil {
		done()
		return nil, q, nil, nil, err
	}
	return se, q, ctx, done, nil
}

// task is what schedule, cancel and reschedule of one task work with:
// the queue, its body (read from the BODY argument or stdin) and a
// layout-aware producer for it.
type task struct {
	se   *session
	q    config.Queue
	ctx  context.Context
	body []byte
	p    *shard.Producer
}

// openTask opens queue Q for one task's command and reads its BODY; done
// closes the session. arg is the BODY argument (checked by the caller).
func openTask(cmd *cobra.Command, s streams, asJSON bool, queue, arg string, raw bool) (t *task, done func(), err error) {
	se, q, ctx, done, err := openQueue(cmd, s, asJSON, queue, 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	t = &task{se: se, q: q, ctx: ctx}
	if t.body, err = readBody(arg, s.stdin, se.cfg.MaxMessageBytes, raw); err != nil {
		done()
		return nil, nil, err
	}
	if t.p, err = shard.NewProducer(se.rdb, se.cfg.KeyPrefix, q.Name, q.Shards); err != nil {
		done()
		return nil, nil, failure(err)
	}
	return t, done, nil
}

// redisFailure is a failed Redis call: exit 1, naming the server.
func (se *session) redisFailure(err error) error {
	if redisconn.Permanent(err) { // e.g. an ACL without a command: a setting
		return settingsError(fmt.Errorf("%s: %v", redact.URL(se.cfg.RedisURL), redact.Error(err)))
	}
	return failure(fmt.Errorf("%s: %v", redact.URL(se.cfg.RedisURL), redact.Error(err)))
}

// queue checks name and returns its settings, the shard count resolved:
// the one recorded in Redis at P:{Q}:shards (Redis is the truth once a
// count is recorded: `dispatcher reshard` changes it), else
// DISPATCHER_QUEUE_<NAME>_SHARDS. A configured count that differs from the
// recorded one (and from the one a change in progress comes from) is told
// on stderr, as the daemon logs it, and the recorded one used. With record,
// a count configured but not yet recorded is recorded, as the daemon does.
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
	envVar := config.QueuePrefix(name) + "_SHARDS"
	l, err := shard.ReadLayout(ctx, se.rdb, keys)
	switch {
	case errors.Is(err, shard.ErrNoLayout) && q.Shards == 0:
		return q, settingsError(fmt.Errorf("queue %s: no shard count recorded at %s (no dispatcher has served it) and %s is not set",
			name, keys.ShardCount(), envVar))
	case errors.Is(err, shard.ErrNoLayout) && record:
		if l, err = shard.EnsureLayout(ctx, se.rdb, keys, q.Shards); err != nil {
			return q, se.redisFailure(err)
		}
	case errors.Is(err, shard.ErrNoLayout):
		l = shard.Layout{Shards: q.Shards}
	case err != nil:
		return q, se.redisFailure(err)
	case q.Shards != 0 && q.Shards != l.Shards && q.Shards != l.From:
		fmt.Fprintf(se.stderr, "dispatcher: warning: %s=%d, but queue %s has %s recorded in Redis: using the recorded count (set the variable to it; `dispatcher reshard` changes the count)\n",
			envVar, q.Shards, name, l)
	}
	q.Shards = l.Shards
	if se.layouts == nil {
		se.layouts = map[string]shard.Layout{}
	}
	se.layouts[name] = l
	return q, nil
}

// adminQueue is the queue as package admin addresses it.
// During a change of the shard count it covers the shards of both counts.
func (se *session) adminQueue(q config.Queue) admin.Queue {
	l, ok := se.layouts[q.Name]
	if !ok {
		l = shard.Layout{Shards: q.Shards}
	}
	return admin.Queue{Keys: shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: q.Name}, Shards: l.Span(), Layout: l}
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
