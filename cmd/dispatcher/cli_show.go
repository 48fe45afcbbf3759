package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

func newShowCmd(s streams) *cobra.Command {
	var queue string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show --queue Q ID",
		Short: "show where a task is, by its id: pending, in flight, dead letter",
		Long: `Shows the task with id ID (or a task without an id, by its body) on
queue Q: pending (with its due time), in flight (claimed by a dispatcher,
not yet confirmed by the broker), dead letter (with its reason), or not
found (never scheduled, cancelled, or delivered). A task scheduled again
after it was claimed shows once per scheduling. Each comes with its
message_id, its body (as text if it is printable, else its length and hex)
and its properties. During a change of the shard count both counts'
shards are looked at.

Exit status: 0 found, 1 not found or Redis failed, 2 bad arguments or
settings.`,
		Example: `  dispatcher show --queue orders order-42:timeout
  dispatcher show --queue orders --json order-42:timeout`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("want one ID; got %d arguments", len(args))
			}
			id := args[0]
			if err := shard.ValidID([]byte(id)); err != nil {
				return usageErrorf("ID: %v", err)
			}
			se, err := openSession(s, asJSON, queue)
			if err != nil {
				return err
			}
			defer se.close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			q, err := se.queue(ctx, queue, false)
			if err != nil {
				return err
			}
			keys := shard.Keys{Prefix: se.cfg.KeyPrefix, Queue: q.Name}
			found, err := findTask(ctx, se.rdb, keys, se.layouts[q.Name], id)
			if err != nil {
				return se.redisFailure(err)
			}
			out := map[string]any{"queue": q.Name, "id": id, "found": found}
			state := "not found"
			if len(found) > 0 {
				state = found[0].State
			}
			out["state"] = state
			se.print(out, func(w io.Writer) {
				if len(found) == 0 {
					fmt.Fprintf(w, "%s: not found on queue %s\n", shortBody(id, bodyWidth), q.Name)
				}
				for _, f := range found {
					printFound(w, f)
				}
			})
			if len(found) == 0 {
				return failure(fmt.Errorf("%.80q is not pending, in flight nor dead on %s (never scheduled, cancelled, or delivered)", id, q.Name))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	jsonFlag(fs, &asJSON)
	return cmd
}

// foundTask is one scheduling of a task that show found.
type foundTask struct {
	State     string          `json:"state"` // pending, in flight, dead letter
	Shard     int             `json:"shard"`
	DueMs     int64           `json:"due_ms"`
	MessageID string          `json:"message_id"`
	Entry     string          `json:"entry,omitempty"`    // in flight, dead: "<due_ms>:<id>"
	LeaseMs   int64           `json:"lease_ms,omitempty"` // in flight: until when it is held
	Reason    string          `json:"reason,omitempty"`   // dead letter
	HasID     bool            `json:"has_id"`             // a body of its own (else the member is the body)
	Body      *string         `json:"body,omitempty"`     // valid UTF-8
	BodyHex   string          `json:"body_hex,omitempty"` // otherwise
	BodyBytes int             `json:"body_bytes"`
	Props     json.RawMessage `json:"properties,omitempty"`
	PropsErr  string          `json:"properties_error,omitempty"` // why the dispatcher would refuse them
	body      []byte
}

func (f *foundTask) setBody(b []byte) {
	f.body, f.BodyBytes = b, len(b)
	if utf8.Valid(b) {
		s := string(b)
		f.Body = &s
	} else {
		f.BodyHex = hex.EncodeToString(b)
	}
}

func (f *foundTask) setProps(p string, ok bool) {
	if !ok {
		return
	}
	if _, err := shard.ParseProperties([]byte(p)); err != nil {
		f.PropsErr = err.Error()
	}
	if json.Valid([]byte(p)) {
		f.Props = json.RawMessage(p)
	} else {
		f.Props, _ = json.Marshal(p) // as a JSON string
	}
}

// findTask looks for id in the shards it may be in under layout l:
// pending (ZSCORE), then the in-flight and dead entries "<due_ms>:<id>",
// found with ZSCAN MATCH "*:<id>" and checked to be exactly the id after
// the first ':'.
func findTask(ctx context.Context, rdb redis.UniversalClient, k shard.Keys, l shard.Layout, id string) ([]foundTask, error) {
	var out []foundTask
	for _, i := range l.Indexes([]byte(id)) {
		pipe := rdb.Pipeline()
		score := pipe.ZScore(ctx, k.Pending(i), id)
		body := pipe.HGet(ctx, k.Tasks(i), id)
		props := pipe.HGet(ctx, k.Props(i), id)
		_, _ = pipe.Exec(ctx)
		s, err := score.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read %s: %w", k.Pending(i), err)
		}
		if err == nil {
			f := foundTask{State: "pending", Shard: i, DueMs: int64(s), MessageID: shard.MessageID([]byte(id), int64(s))}
			b, err := optional(body, k.Tasks(i))
			if err != nil {
				return nil, err
			}
			f.HasID = b != nil
			if b == nil {
				b = []byte(id)
			}
			f.setBody(b)
			p, err := optional(props, k.Props(i))
			if err != nil {
				return nil, err
			}
			f.setProps(string(p), p != nil)
			out = append(out, f)
		}
		for _, st := range []struct {
			state string
			key   string
		}{{"in flight", k.Inflight(i)}, {"dead letter", k.Dead(i)}} {
			entries, err := scanEntries(ctx, rdb, st.key, id)
			if err != nil {
				return nil, err
			}
			for _, e := range entries {
				f, err := claimedTask(ctx, rdb, k, i, st.state, e, id)
				if err != nil {
					return nil, err
				}
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// optional is an HGET's value, nil if the field is absent.
func optional(c *redis.StringCmd, key string) ([]byte, error) {
	b, err := c.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return b, nil
}

// scanEntries finds the entries "<due_ms>:<id>" of the sorted set key.
func scanEntries(ctx context.Context, rdb redis.UniversalClient, key, id string) ([]redis.Z, error) {
	var out []redis.Z
	var cursor uint64
	for {
		kv, next, err := rdb.ZScan(ctx, key, cursor, "*:"+redisconn.GlobEscape(id), 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", key, err)
		}
		for n := 0; n+1 < len(kv); n += 2 {
			due, member, ok := strings.Cut(kv[n], ":")
			if !ok || member != id {
				continue // another id ending in ":<id>"
			}
			if _, err := strconv.ParseInt(due, 10, 64); err != nil {
				continue
			}
			sc, _ := strconv.ParseFloat(kv[n+1], 64)
			out = append(out, redis.Z{Member: kv[n], Score: sc})
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// claimedTask reads what an in-flight or dead entry has beside it.
func claimedTask(ctx context.Context, rdb redis.UniversalClient, k shard.Keys, i int, state string, z redis.Z, id string) (foundTask, error) {
	entry := z.Member.(string)
	due, _, _ := strings.Cut(entry, ":")
	dueMs, _ := strconv.ParseInt(due, 10, 64)
	f := foundTask{State: state, Shard: i, DueMs: dueMs, Entry: entry, MessageID: shard.MessageID([]byte(id), dueMs)}
	pipe := rdb.Pipeline()
	body := pipe.HGet(ctx, k.ClaimedBody(i), entry)
	props := pipe.HGet(ctx, k.ClaimedProps(i), entry)
	var reason *redis.StringCmd
	if state == "dead letter" {
		reason = pipe.HGet(ctx, k.DeadReason(i), entry)
	} else {
		f.LeaseMs = int64(z.Score)
	}
	_, _ = pipe.Exec(ctx)
	b, err := optional(body, k.ClaimedBody(i))
	if err != nil {
		return f, err
	}
	f.HasID = b != nil
	if b == nil {
		b = []byte(id)
	}
	f.setBody(b)
	p, err := optional(props, k.ClaimedProps(i))
	if err != nil {
		return f, err
	}
	f.setProps(string(p), p != nil)
	if reason != nil {
		r, err := optional(reason, k.DeadReason(i))
		if err != nil {
			return f, err
		}
		f.Reason = string(r)
	}
	return f, nil
}

// printable reports whether b reads as text.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

func printFound(w io.Writer, f foundTask) {
	fmt.Fprintf(w, "%s in shard %d, due %s, message_id %s\n", f.State, f.Shard, utcMs(f.DueMs, humanTime)+"Z", f.MessageID)
	if f.LeaseMs != 0 {
		fmt.Fprintf(w, "  held until %sZ\n", utcMs(f.LeaseMs, humanTime))
	}
	if f.State == "dead letter" {
		r := f.Reason
		if r == "" {
			r = "(none recorded)"
		}
		fmt.Fprintf(w, "  reason: %s\n", r)
	}
	switch {
	case !f.HasID:
		fmt.Fprintf(w, "  body: the member itself (no id), %s\n", plural(f.BodyBytes, "byte", "bytes"))
	case printable(f.body):
		fmt.Fprintf(w, "  body (%s): %s\n", plural(f.BodyBytes, "byte", "bytes"), f.body)
	default:
		h := hex.EncodeToString(f.body)
		if len(h) > 2*bodyWidth {
			h = h[:2*bodyWidth] + "…"
		}
		fmt.Fprintf(w, "  body (%s, not text), hex: %s\n", plural(f.BodyBytes, "byte", "bytes"), h)
	}
	if f.Props != nil {
		fmt.Fprintf(w, "  properties: %s\n", f.Props)
		if f.PropsErr != "" {
			fmt.Fprintf(w, "  properties refused: %s (the dispatcher dead-letters the task)\n", f.PropsErr)
		}
	}
}
