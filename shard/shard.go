// Package shard holds the public contract of the task store: key names,
// the XXH64 shard choice, message ids, and the Go producer API.
package shard

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// MaxShards is the largest shard count the contract allows.
const MaxShards = 4096

// DefaultPrefix is the contract's default key prefix.
const DefaultPrefix = "dq"

var queueNameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)

// ValidQueueName reports whether name satisfies the contract:
// 1 to 64 characters of A-Z a-z 0-9 _ . -
func ValidQueueName(name string) bool { return queueNameRE.MatchString(name) }

// Hash is XXH64 of the member with seed 0.
func Hash(member []byte) uint64 { return xxhash.Sum64(member) }

// Index is the shard a member belongs to: XXH64(member) mod m.
func Index(member []byte, m int) int {
	return int(Hash(member) % uint64(m))
}

// SecondsScoreBelow: a due time under 10^11 ms (March 1973) is almost
// surely a producer writing seconds; read as ms it is long past, so the
// dispatcher sends it at once, and counts and logs it so the producer bug
// gets noticed.
const SecondsScoreBelow = 100_000_000_000

// LooksLikeSeconds reports whether a score is such a due time in seconds.
func LooksLikeSeconds(score int64) bool { return score > 0 && score < SecondsScoreBelow }

// MessageID is the AMQP message_id of one scheduling of a member:
// lowercase 16-digit hex XXH64, "-", due time in ms.
func MessageID(member []byte, dueMs int64) string { return MessageIDOf(Hash(member), dueMs) }

// MessageIDOf is MessageID of a member whose Hash is known.
func MessageIDOf(hash uint64, dueMs int64) string { return fmt.Sprintf("%016x-%d", hash, dueMs) }

// Keys builds every Redis key of one queue. All keys of shard i carry the
// hash tag {Q:i} so one Lua script may touch them on Redis Cluster.
type Keys struct {
	Prefix string
	Queue  string
}

func (k Keys) tag(i int) string { return k.Prefix + ":{" + k.Queue + ":" + strconv.Itoa(i) + "}" }

// Pending is the contract's sorted set of scheduled tasks, P:{Q:i}.
func (k Keys) Pending(i int) string { return k.tag(i) }

// PendingRange returns Pending(i) for i from lo to hi-1, cut from one
// string built at once: a walk over the indexes beyond a queue's shards
// looks at hundreds of them every few seconds per queue, where a string
// of its own for each key was a tenth of an idle instance's CPU profile.
func (k Keys) PendingRange(lo, hi int) []string {
	if hi <= lo {
		return nil
	}
	head := k.Prefix + ":{" + k.Queue + ":"
	buf := make([]byte, 0, (hi-lo)*(len(head)+5))
	ends := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		buf = append(buf, head...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, '}')
		ends = append(ends, len(buf))
	}
	all := string(buf)
	out := make([]string, len(ends))
	from := 0
	for n, end := range ends {
		out[n] = all[from:end]
		from = end
	}
	return out
}

// Inflight holds claimed, unconfirmed tasks; score is the lease deadline (ms,
// Redis server clock), member is "<due_ms>:<member>".
func (k Keys) Inflight(i int) string { return k.tag(i) + ":inflight" }

// Attempts counts failed publishes per in-flight entry (hash).
func (k Keys) Attempts(i int) string { return k.tag(i) + ":attempts" }

// Retrying indexes the in-flight entries that have failed a publish (those
// in the attempts hash) by due time: entry "<due_ms>:<member>", score the
// due ms. The in-flight set is ordered by lease, so without it the oldest
// retried task could only be found by a scan.
func (k Keys) Retrying(i int) string { return k.tag(i) + ":retrying" }

// Dead is the dead-letter sorted set: member "<due_ms>:<member>" (one per
// scheduling, like in-flight entries), score = due time.
func (k Keys) Dead(i int) string { return k.tag(i) + ":dead" }

// DeadReason maps a dead entry to why it died (hash).
func (k Keys) DeadReason(i int) string { return k.tag(i) + ":dead:reason" }

// LastClaim records the shard's last claims (token and lease deadline
// pairs, newest last), so a claim run again after a lost reply returns
// the same batch instead of claiming another.
func (k Keys) LastClaim(i int) string { return k.tag(i) + ":claim" }

// Owners records which instance holds each claim of the shard (sorted
// set: member "<instance> <deadline>", score = the claim's lease deadline),
// so that a crashed instance's claims are handed out again as soon as it
// is known dead, not when their lease runs out (see internal/liveness).
func (k Keys) Owners(i int) string { return k.tag(i) + ":owners" }

// Paused, while it exists, holds the shard's claims (`dispatcher pause`):
// one per shard, so that the claim script sees it atomically, on Redis
// Cluster too. Its value is the ms at which the queue was paused.
func (k Keys) Paused(i int) string { return k.tag(i) + ":paused" }

// Tasks holds the bodies of tasks scheduled with an id (hash: id -> body),
// P:{Q:i}:tasks. A pending member with a field here is an id; one without
// is its own body. The claim moves the field to ClaimedBody.
func (k Keys) Tasks(i int) string { return k.tag(i) + ":tasks" }

// Props holds the message properties of pending tasks (hash: member ->
// JSON object, see Properties), P:{Q:i}:props. The claim moves the field
// to ClaimedProps.
func (k Keys) Props(i int) string { return k.tag(i) + ":props" }

// ClaimedBody holds the bodies of claimed tasks that had one in Tasks
// (hash: in-flight or dead entry "<due_ms>:<id>" -> body): moved there by
// the claim, so that a producer scheduling the same id again writes a
// body of its own, which the older scheduling's ack cannot delete. It
// leaves with the entry: ack, purge, requeue, unclaim.
func (k Keys) ClaimedBody(i int) string { return k.tag(i) + ":claimed:body" }

// ClaimedProps is ClaimedBody for the properties (entry -> JSON).
func (k Keys) ClaimedProps(i int) string { return k.tag(i) + ":claimed:props" }

// Moving, during a change of the shard count, maps the members a move
// has added to this shard, not yet confirmed, to the score it added (hash,
// expiring): the move undoes an add only while its member is still listed,
// and the Go producer's writes to the shard unlist the member, so that a
// move never undoes a schedule that came after its add (reshard/scripts.go).
func (k Keys) Moving(i int) string { return k.tag(i) + ":moving" }

// DeadMoving is Moving for dead letters: the entries a move has added to
// this shard's dead-letter set, not yet confirmed, mapped to the score
// added (hash, expiring).
func (k Keys) DeadMoving(i int) string { return k.tag(i) + ":dead:moving" }

// BulkProgress is how far bulk run id (`dispatcher cancel|reschedule
// --match`) has walked shard i (hash, expiring): in the shard's hash tag,
// so the script that changes a batch records it in the same step.
func (k Keys) BulkProgress(i int, id string) string { return k.tag(i) + ":bulk:" + id }

// BulkRun is what bulk run id does (its filters and change, JSON,
// expiring), so that --resume ID continues exactly that.
func (k Keys) BulkRun(id string) string { return k.Prefix + ":{" + k.Queue + "}:bulk:" + id }

// Rate is the token bucket of the queue's dispatch rate limit (hash).
func (k Keys) Rate() string { return k.Prefix + ":{" + k.Queue + "}:rate" }

// Counter is the balancer's INCR counter for the queue.
func (k Keys) Counter() string { return k.Prefix + ":{" + k.Queue + "}:counter" }

// ShardCount records the queue's shard count M (string).
func (k Keys) ShardCount() string { return k.Prefix + ":{" + k.Queue + "}:shards" }

// Reshard, while it exists, describes a change of the shard count in
// progress (hash: from, to, started_ms, and the mover's progress).
func (k Keys) Reshard() string { return k.Prefix + ":{" + k.Queue + "}:reshard" }

// ReshardLock names the one process moving tasks between shards (string
// with a TTL).
func (k Keys) ReshardLock() string { return k.Prefix + ":{" + k.Queue + "}:reshard:lock" }

// Retired records the shard count a shrink retired (string): its extra
// shards are watched for tasks from producers still hashing with it.
func (k Keys) Retired() string { return k.Prefix + ":{" + k.Queue + "}:retired" }

// Shard returns the pending key of the shard a member belongs to.
func (k Keys) Shard(member []byte, m int) string { return k.Pending(Index(member, m)) }

// Sweeper names the instance that currently sweeps the queue's shards for
// newly scheduled tasks (string with a TTL), so idle polling costs the same
// whatever the number of instances.
func (k Keys) Sweeper() string { return k.Prefix + ":{" + k.Queue + "}:sweeper" }

// Instances holds what each live instance serving the queue last said of
// it (hash: instance id -> "<seen_ms> <JSON record>", with a TTL; package
// internal/instances), for every instance's status page and /readyz.
func (k Keys) Instances() string { return k.Prefix + ":{" + k.Queue + "}:instances" }

// Wake is the pub/sub channel on which producers and instances wake the
// queue's dispatchers (see WakeDue, WakeBusy, WakeLead).
func (k Keys) Wake() string { return k.Prefix + ":{" + k.Queue + "}:wake" }

// Recurring holds the queue's recurring schedules (hash: name -> JSON
// definition; package recurring).
func (k Keys) Recurring() string { return k.Prefix + ":{" + k.Queue + "}:recurring" }

// RecurringRev counts changes to the queue's recurring schedules (string):
// instances read it to notice a change, and each definition carries the
// value of its last change.
func (k Keys) RecurringRev() string { return k.Prefix + ":{" + k.Queue + "}:recurring:rev" }

// RecurringStatus holds what the materialiser last did per schedule (hash:
// name -> JSON: last and next occurrence, error, the shard its state is in).
func (k Keys) RecurringStatus() string { return k.Prefix + ":{" + k.Queue + "}:recurring:status" }

// RecurringState records, per schedule whose body hashes to shard i, the
// last occurrence materialised (hash: name -> "<rev>:<due_ms>:<flag>"). It
// carries the shard's hash tag so that the script that ZADDs an occurrence
// checks and moves it atomically, on Redis Cluster too.
func (k Keys) RecurringState(i int) string { return k.tag(i) + ":recurring" }
