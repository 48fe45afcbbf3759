package ingress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/amqptable"
	"github.com/dispatcher/dispatcher/shard"
)

// A message the ingress refuses as a task (bad x-delay or x-due-ms, a due
// time beyond the maximum delay, a body over the size limit, properties
// that cannot be stored as sent) becomes a dead letter of the queue, as a
// task the broker kept refusing does (scanner/scripts.go, failScript):
// entry "<due_ms>:<id>" in P:{Q:i}:dead, its reason in P:{Q:i}:dead:reason,
// its body and properties in P:{Q:i}:claimed:body and :claimed:props under
// the entry. `dispatcher dead list` shows it, `dead requeue` schedules it
// (at once: its due time is the message's base time) and `dead purge`
// forgets it, like any dead letter. Only what cannot be stored that way is
// rejected to the ingress queue's dead-letter exchange, with the reason
// logged: a malformed cancel (it is no task), and a dead letter Redis
// refuses (out of memory, a key of the wrong type).

// deadLetter is a refused message as the dead letter it becomes.
type deadLetter struct {
	id    []byte
	body  []byte
	props []byte // JSON, nil: none
	dueMs int64
	shard int    // set by storeDead
	entry string // "<due_ms>:<id>", once stored
	err   error  // Redis refused to store it: rejected to the DLX instead
}

// deadLetterOf makes the dead letter of a refused delivery, due at base
// (ms). It keeps what the message carries: properties the task could not
// hold are kept as sent where JSON can hold them (a requeued dead letter
// whose properties are over the task's 32 KiB is dead-lettered again at
// its due time, with that reason), and only what JSON cannot hold (a NaN
// header, an expiration that is no number) is left out; notes says what
// was, for the reason.
func deadLetterOf(d amqp.Delivery, base int64) (dl *deadLetter, notes []string) {
	id := []byte(d.MessageId)
	if shard.ValidID(id) != nil {
		id = newID()
	}
	p := shard.Properties{
		RoutingKey: d.RoutingKey, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type, MessageID: d.MessageId,
	}
	if d.Priority != 0 {
		pr := int(d.Priority)
		p.Priority = &pr
	}
	if d.Expiration != "" {
		if ms, err := strconv.ParseInt(d.Expiration, 10, 64); err == nil && ms >= 0 {
			p.ExpirationMs = &ms
		} else {
			notes = append(notes, fmt.Sprintf("expiration %q left out", d.Expiration))
		}
	}
	h := amqp.Table{}
	for k, v := range d.Headers {
		if shard.ReservedHeader(k) {
			continue
		}
		if _, err := amqptable.Encode(amqp.Table{k: v}); err != nil {
			notes = append(notes, fmt.Sprintf("header %q left out", k))
			continue
		}
		h[k] = v
	}
	sort.Strings(notes) // map order: the same message, the same reason
	if len(h) > 0 {
		b, err := amqptable.Encode(h)
		if err == nil {
			p.AMQPHeaders = b
		}
	}
	dl = &deadLetter{id: id, body: d.Body, dueMs: base}
	if !p.IsZero() {
		// Not p.Marshal: properties over the task's limit are kept as sent.
		if b, err := json.Marshal(p); err == nil {
			dl.props = b
		}
	}
	return dl, notes
}

// newID is the id of a message without a message_id: a redelivery after
// a crash before the ack may become a second task (documented).
func newID() []byte {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return []byte("ingress-" + hex.EncodeToString(b[:]))
}

// largestHeader names the delivery's largest header, for the reason of
// properties over the task's limit.
func largestHeader(d amqp.Delivery) string {
	best, size := "", 0
	for k, v := range d.Headers {
		b, err := amqptable.Encode(amqp.Table{k: v})
		if err == nil && len(b) > size {
			best, size = k, len(b)
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("header %q is the largest (%d bytes stored)", best, size)
}

// deadScript writes the dead letters of one shard. An entry that is in
// flight (a task of the same id and due time being dispatched) is not
// touched: the dead letter takes the next free ms instead, since the two
// would share their claimed fields. The same entry dead already (the same
// message redelivered) is written again, not twice.
//
// It has no allow-oom flag: it adds data, and a Redis out of memory
// refuses it (the message then goes to the ingress queue's dead-letter
// exchange).
//
// KEYS[1] in-flight set P:{Q:i}:inflight
// KEYS[2] dead-letter set P:{Q:i}:dead (member = entry, score = due ms)
// KEYS[3] dead-letter reasons P:{Q:i}:dead:reason
// KEYS[4] claimed bodies P:{Q:i}:claimed:body (entry -> body)
// KEYS[5] claimed properties P:{Q:i}:claimed:props (entry -> JSON)
// ARGV[1..] quintuples: due ms, id, body, properties ("" for none), reason
// Returns the entries written, in order.
var deadScript = redis.NewScript(`
for i, t in ipairs({'zset', 'zset', 'hash', 'hash', 'hash'}) do
  local got = redis.call('TYPE', KEYS[i])['ok']
  if got ~= 'none' and got ~= t then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. got .. ', not a ' .. t .. '; nothing changed')
  end
end
local out = {}
for i = 1, #ARGV, 5 do
  local due, id = tonumber(ARGV[i]), ARGV[i + 1]
  local e = string.format('%d', due) .. ':' .. id
  while redis.call('ZSCORE', KEYS[1], e) do
    due = due + 1
    e = string.format('%d', due) .. ':' .. id
  end
  redis.call('ZADD', KEYS[2], due, e)
  redis.call('HSET', KEYS[3], e, ARGV[i + 4])
  redis.call('HSET', KEYS[4], e, ARGV[i + 2])
  if ARGV[i + 3] ~= '' then
    redis.call('HSET', KEYS[5], e, ARGV[i + 3])
  else
    redis.call('HDEL', KEYS[5], e)
  end
  out[#out + 1] = e
end
return out
`)

// storeDead writes the dead letters of a batch, one script call per shard.
// A dead letter Redis refuses gets its err (it goes to the ingress queue's
// dead-letter exchange); a Redis that cannot be reached, or answers that it
// is busy, loading or failing over, is the returned error: nothing is
// acked, and the batch tries again.
func (g *Ingress) storeDead(ctx context.Context, items []item) error {
	l := g.prod.Layout(ctx)
	k := g.prod.Keys()
	byShard := map[int][]*item{}
	var order []int
	for n := range items {
		it := &items[n]
		if it.dead == nil || it.dead.entry != "" || it.dead.err != nil {
			continue
		}
		i := shard.Index(it.dead.id, l.Shards)
		it.dead.shard = i
		if byShard[i] == nil {
			order = append(order, i)
		}
		byShard[i] = append(byShard[i], it)
	}
	for _, i := range order {
		its := byShard[i]
		args := make([]any, 0, 5*len(its))
		for _, it := range its {
			args = append(args, it.dead.dueMs, it.dead.id, it.dead.body, it.dead.props, "ingress: "+it.reason)
		}
		keys := []string{k.Inflight(i), k.Dead(i), k.DeadReason(i), k.ClaimedBody(i), k.ClaimedProps(i)}
		entries, err := deadScript.Run(ctx, g.rdb, keys, args...).StringSlice()
		if err == nil && len(entries) != len(its) {
			err = fmt.Errorf("%d entries written for %d dead letters", len(entries), len(its))
		}
		if err != nil {
			if !refused(err) {
				return fmt.Errorf("writing %d dead letters to %s: %w", len(its), k.Dead(i), err)
			}
			for _, it := range its {
				it.dead.err = fmt.Errorf("%s: %w", k.Dead(i), err)
			}
			continue
		}
		for n, it := range its {
			it.dead.entry = entries[n]
		}
	}
	return nil
}

// refused reports whether err is Redis refusing the write itself (out of
// memory, a key of the wrong type, no permission), which trying again does
// not change, as opposed to no answer or an answer that passes (LOADING,
// BUSY, a failover, a slot moving, too many clients).
func refused(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "MOVED", "ASK", "NOREPLICAS"} {
		if redis.HasErrorPrefix(err, p) {
			return false
		}
	}
	return !strings.Contains(re.Error(), "max number of clients")
}
