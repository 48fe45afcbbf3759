package recurring

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// File is the schedule file (DISPATCHER_RECURRING_FILE): JSON, so that it
// needs no dependency, has no implicit typing (YAML reads `09:00` or `no`
// as something else), holds bodies that are JSON themselves as plain
// strings, and is written as easily by a tool as by hand. Unknown fields
// are errors: a typo is not silently ignored.
//
//	{"schedules": [
//	  {"queue": "orders", "name": "nightly-report", "cron": "0 9 * * *",
//	   "tz": "Europe/Berlin", "body": "{\"report\":\"daily\"}", "catchup": "latest"}
//	]}
type File struct {
	Schedules []Def `json:"schedules"`
}

// ParseFile decodes a schedule file.
func ParseFile(b []byte) (File, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return File{}, fmt.Errorf("not a schedule file (JSON {\"schedules\": [...]}): %w", err)
	}
	for i := range f.Schedules {
		d := &f.Schedules[i]
		if d.Source != "" || d.Rev != 0 || d.Paused {
			return File{}, fmt.Errorf("schedule %d (%s/%s): source, rev and paused are not set in the file (pause with `dispatcher recurring pause`)", i, d.Queue, d.Name)
		}
	}
	return f, nil
}

// FileSource marks definitions the file owns.
const FileSource = "file"

// Reconciler makes the schedules in Redis match the file, for the queues
// this instance serves: it adds and changes the file's schedules and
// removes those the file added before and no longer has. Schedules added
// from the CLI are left alone, and a schedule's pause (an operator's act)
// survives reconciling.
type Reconciler struct {
	rdb    redis.UniversalClient
	prefix string
	served []string
	log    *slog.Logger
}

// NewReconciler returns a reconciler for the queues served.
func NewReconciler(rdb redis.UniversalClient, prefix string, served []string, log *slog.Logger) *Reconciler {
	return &Reconciler{rdb: rdb, prefix: prefix, served: served, log: log}
}

// Result counts what a reconcile did.
type Result struct {
	Added, Changed, Removed, Unchanged int
	Invalid                            []error // one per schedule left out, naming it
}

// Reconcile applies f. A schedule that is invalid (bad cron expression,
// unknown zone, a queue this instance does not serve, a name or body used
// twice in one queue) is left out with an error naming it, and whatever
// Redis holds under its name is kept; the others are applied. The error
// returned is Redis's.
func (r *Reconciler) Reconcile(ctx context.Context, f File) (Result, error) {
	var res Result
	want := map[string]map[string]Def{} // queue -> name -> def
	bodies := map[string]map[string]string{}
	named := map[string]map[string]bool{} // names the file has, valid or not
	for _, d := range f.Schedules {
		if named[d.Queue] == nil {
			named[d.Queue], want[d.Queue], bodies[d.Queue] = map[string]bool{}, map[string]Def{}, map[string]string{}
		}
		d.Source = FileSource
		if _, err := Parse(d); err != nil {
			named[d.Queue][d.Name] = true
			res.Invalid = append(res.Invalid, err)
			continue
		}
		bad := func(why string) {
			res.Invalid = append(res.Invalid, fmt.Errorf("%w %s/%s: %s", ErrInvalid, d.Queue, d.Name, why))
		}
		switch {
		case !slices.Contains(r.served, d.Queue):
			bad(fmt.Sprintf("queue %q is not served by this instance (DISPATCHER_QUEUES=%s)", d.Queue, strings.Join(r.served, ",")))
			continue
		case named[d.Queue][d.Name]:
			bad("the name is used twice in the file")
			continue
		case bodies[d.Queue][d.Body] != "":
			bad(fmt.Sprintf("same body as %s: two schedules of one queue need different bodies (a sorted set holds a member once)", bodies[d.Queue][d.Body]))
			named[d.Queue][d.Name] = true
			continue
		}
		named[d.Queue][d.Name] = true
		want[d.Queue][d.Name] = d
		bodies[d.Queue][d.Body] = d.Name
	}
	var errs []error
	for _, q := range r.served {
		st := NewStore(r.rdb, shard.Keys{Prefix: r.prefix, Queue: q})
		have, _, err := st.Defs(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Removals first: a schedule renamed in the file (same body, new
		// name) must not be refused for the body of its old name.
		kept := have[:0:0]
		for _, d := range have {
			if d.Source == FileSource && !named[q][d.Name] {
				if _, err := st.Remove(ctx, d.Name); err != nil && !errors.Is(err, ErrNotFound) {
					errs = append(errs, err)
					kept = append(kept, d)
					continue
				}
				res.Removed++
				continue
			}
			kept = append(kept, d)
		}
		have = kept
		byName := map[string]Def{}
		for _, d := range have {
			byName[d.Name] = d
		}
		for _, name := range sortedKeys(want[q]) {
			d := want[q][name]
			old, exists := byName[name]
			if exists && old.Source != FileSource {
				res.Invalid = append(res.Invalid, fmt.Errorf("%w %s/%s: a schedule of that name was added from the CLI; remove it there first (`dispatcher recurring remove`)", ErrInvalid, q, name))
				continue
			}
			if other := bodyOwner(have, d); other != "" {
				res.Invalid = append(res.Invalid, fmt.Errorf("%w %s/%s: same body as schedule %s: two schedules of one queue need different bodies", ErrInvalid, q, name, other))
				continue
			}
			d.Paused = exists && old.Paused
			changed, err := st.Put(ctx, d)
			switch {
			case err != nil:
				errs = append(errs, err)
			case !changed:
				res.Unchanged++
			case exists:
				res.Changed++
			default:
				res.Added++
			}
		}
	}
	return res, errors.Join(errs...)
}

// bodyOwner names another schedule in have with d's body, if any.
func bodyOwner(have []Def, d Def) string {
	for _, h := range have {
		if h.Name != d.Name && h.Body == d.Body {
			return h.Name
		}
	}
	return ""
}

func sortedKeys(m map[string]Def) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// FilePoll is how often the watcher reads the file to see whether its
// content changed (a local read: no Redis command unless it did).
const FilePoll = 2 * time.Second

// Watcher reconciles the schedule file at start and whenever its content
// changes: "on change" means the bytes differ from those last reconciled
// successfully, read every FilePoll, so an edit, a `git checkout`, or a
// ConfigMap's symlink swap all count, and a reconcile Redis refused is
// tried again.
type Watcher struct {
	path string
	rec  *Reconciler
	log  *slog.Logger
	poll time.Duration
	// OnReconcile, if set, is called after each reconcile (tests).
	OnReconcile func(Result, error)
}

// NewWatcher returns a watcher of path.
func NewWatcher(path string, rec *Reconciler, log *slog.Logger) *Watcher {
	return &Watcher{path: path, rec: rec, log: log.With("file", path), poll: FilePoll}
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	var done, bad [32]byte // content last reconciled; last content found unreadable as a file
	for {
		b, err := os.ReadFile(w.path)
		switch {
		case err != nil:
			if bad != [32]byte{1} {
				w.log.Error("cannot read the recurring schedule file; the schedules in Redis stay as they are", "err", err)
				bad = [32]byte{1}
			}
		case sha256.Sum256(b) != done && sha256.Sum256(b) != bad:
			sum := sha256.Sum256(b)
			f, err := ParseFile(b)
			if err != nil {
				w.log.Error("recurring schedule file not applied; the schedules in Redis stay as they are", "err", err)
				bad = sum
				break
			}
			res, err := w.rec.Reconcile(ctx, f)
			for _, e := range res.Invalid {
				w.log.Error("recurring schedule not applied", "err", e)
			}
			if err != nil {
				w.log.Warn("recurring schedule file: Redis failed; trying again", "err", err)
			} else {
				done, bad = sum, [32]byte{}
				w.log.Info("recurring schedule file applied", "added", res.Added, "changed", res.Changed,
					"removed", res.Removed, "unchanged", res.Unchanged, "invalid", len(res.Invalid))
			}
			if w.OnReconcile != nil {
				w.OnReconcile(res, err)
			}
		}
		if !sleep(ctx, w.poll) {
			return nil
		}
	}
}
