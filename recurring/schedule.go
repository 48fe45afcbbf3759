// Package recurring turns cron schedules into ordinary pending tasks, one
// occurrence at a time, exactly once per occurrence whatever the number of
// instances, crashes or restarts (docs/recurring.md).
//
// A schedule (Def) lives in Redis with its queue; the queue's sweeping
// instance runs a Materialiser that ZADDs each occurrence into the body's
// shard per CONTRACT.md once the occurrence before it has left pending.
// What "occurrence k was materialised" means is recorded beside the shard,
// under the same hash tag, so that one script checks and writes it with the
// ZADD on Redis Cluster too.
package recurring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/dispatcher/dispatcher/shard"
)

// Catch-up policies: what a schedule does with the occurrences it missed
// while no instance materialised it (every instance down, the queue not
// served) for longer than its grace.
const (
	CatchUpLatest = "latest" // fire the latest occurrence at or before now once (the default)
	CatchUpAll    = "all"    // fire every missed occurrence, oldest first (at most the MaxCatchUp most recent)
	CatchUpSkip   = "skip"   // fire none: go on with the first occurrence after now
)

// DefaultGrace is how late an occurrence may be materialised and still
// count as on time rather than missed: longer than a sweeper handover
// (2.25 s at the defaults) and a Redis failover, so that neither makes a
// schedule skip an occurrence under the "latest" or "skip" policy.
const DefaultGrace = 10 * time.Second

// MaxCatchUp bounds the "all" policy: after a longer outage only the most
// recent MaxCatchUp occurrences at or before now fire (catchup.go).
const MaxCatchUp = 1000

// MinInterval is the shortest gap between two occurrences a schedule may
// have: each occurrence is materialised only after the one before it left
// pending, which takes a claim, so a shorter gap could not be kept.
const MinInterval = time.Second

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,128}$`)

// Def is one recurring task as the operator defines it.
type Def struct {
	Queue string `json:"queue"`
	Name  string `json:"name"`
	// Cron is a standard 5-field expression (minute hour day month
	// weekday), a 6-field one with seconds first, a descriptor such as
	// @daily, or @every <duration>.
	Cron string `json:"cron"`
	// TZ is the IANA zone the expression is read in; empty means UTC.
	TZ   string `json:"tz,omitempty"`
	Body string `json:"body"`
	// Properties are each occurrence's message properties: the JSON
	// object of shard.Properties, written to the props hash under the body
	// with every occurrence. deadline_ms is refused: a fixed time cannot
	// suit every occurrence.
	Properties PropsJSON `json:"properties,omitempty"`
	CatchUp    string    `json:"catchup,omitempty"` // latest (default), all or skip
	// Grace is how late an occurrence may be and still count as on time
	// (DefaultGrace when empty): Go duration syntax.
	Grace  string `json:"grace,omitempty"`
	Paused bool   `json:"paused,omitempty"`
	// Source is who owns the definition: "cli", or "file" (reconciled
	// from DISPATCHER_RECURRING_FILE, which removes what it no longer has).
	Source string `json:"source,omitempty"`
	// Rev is the store's revision at the definition's last change; the
	// state of what was materialised carries it (store.go).
	Rev int64 `json:"rev,omitempty"`
}

// parser reads standard 5-field expressions, an optional seconds field in
// front, and descriptors (@daily, @every 30s).
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Schedule is a parsed Def: its occurrences, and what to do with missed ones.
type Schedule struct {
	Def
	cron cron.Schedule
	// wall, for an expression with fixed hours, is it read on the wall
	// clock (in UTC, which has no DST): see next. An interface, as cron
	// is, so that tests can count the occurrences a search computes.
	wall cron.Schedule
	// every is the gap of an @every schedule (0 otherwise): its
	// occurrences after a cursor are cursor's next plus whole gaps, which
	// the catch-up works out by arithmetic (catchup.go).
	every time.Duration
	loc   *time.Location
	grace time.Duration
	// props is Properties validated and in canonical form, nil for none.
	props []byte
}

// PropsJSON is a schedule's properties: a JSON object, kept as compact
// text so that a Def stays comparable (the materialiser tells a changed
// definition by ==). "" is none.
type PropsJSON string

// MarshalJSON writes the object as it is.
func (p PropsJSON) MarshalJSON() ([]byte, error) {
	if p == "" {
		return []byte("null"), nil
	}
	return []byte(p), nil
}

// UnmarshalJSON keeps any JSON value, compacted: Parse says what is wrong
// with one that is not a valid properties object, naming the schedule.
func (p *PropsJSON) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*p = ""
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return err
	}
	*p = PropsJSON(buf.String())
	return nil
}

// ParseProps reads a properties object as a schedule takes it (for a
// command line flag): validated by shard.ParseProperties, deadline_ms
// refused.
func ParseProps(s string) (PropsJSON, []byte, error) {
	p, err := shard.ParseProperties([]byte(s))
	if err != nil {
		return "", nil, err
	}
	if p.DeadlineMs != nil {
		return "", nil, fmt.Errorf("properties: deadline_ms %d: a fixed time (ms since the epoch) would dead-letter every occurrence after it; a recurring schedule cannot have one (expiration_ms, a time to live, suits every occurrence)", *p.DeadlineMs)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		return "", nil, fmt.Errorf("properties: %w", err)
	}
	if p.IsZero() {
		return PropsJSON(buf.String()), nil, nil
	}
	b, err := p.Marshal()
	if err != nil {
		return "", nil, err
	}
	return PropsJSON(buf.String()), b, nil
}

// Props is the properties each occurrence is written with (canonical
// JSON), nil for none.
func (s *Schedule) Props() []byte { return s.props }

// ErrInvalid marks a definition that cannot be used.
var ErrInvalid = errors.New("invalid recurring schedule")

// Parse validates d and returns its schedule. The error names the
// schedule and the field.
func Parse(d Def) (*Schedule, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %s/%s: %s", ErrInvalid, d.Queue, d.Name, fmt.Sprintf(format, args...))
	}
	if !nameRE.MatchString(d.Name) {
		return nil, bad("name %q: want 1 to 128 characters of A-Z a-z 0-9 _ . -", d.Name)
	}
	loc := time.UTC
	if d.TZ != "" {
		l, err := time.LoadLocation(d.TZ)
		if err != nil {
			return nil, bad("time zone %q: unknown (want an IANA name such as Europe/Berlin)", d.TZ)
		}
		loc = l
	}
	// The zone is given on its own: CRON_TZ= in the expression would
	// silently override it.
	if len(d.Cron) >= 3 && (d.Cron[:3] == "TZ=" || len(d.Cron) >= 8 && d.Cron[:8] == "CRON_TZ=") {
		return nil, bad("cron %q: give the zone as tz, not in the expression", d.Cron)
	}
	if every, ok := strings.CutPrefix(d.Cron, "@every "); ok {
		// robfig rounds a delay down to whole seconds, and up to 1s:
		// refuse what it would silently change.
		if dur, err := time.ParseDuration(strings.TrimSpace(every)); err == nil && (dur < MinInterval || dur%time.Second != 0) {
			return nil, bad("cron %q: @every takes whole seconds, at least %s", d.Cron, MinInterval)
		}
	}
	c, err := parser.Parse(d.Cron)
	if err != nil {
		return nil, bad("cron %q: %v", d.Cron, err)
	}
	s := &Schedule{Def: d, cron: c, loc: loc, grace: DefaultGrace}
	if cd, ok := c.(cron.ConstantDelaySchedule); ok {
		s.every = cd.Delay
	}
	if spec, ok := c.(*cron.SpecSchedule); ok {
		at := *spec
		at.Location = loc
		s.cron = &at
		if spec.Hour&allHours != allHours {
			w := *spec
			w.Location = time.UTC
			s.wall = &w
		}
	}
	if d.Properties != "" {
		_, b, err := ParseProps(string(d.Properties))
		if err != nil {
			return nil, bad("%v", err)
		}
		s.props = b
	}
	if d.Grace != "" {
		g, err := time.ParseDuration(d.Grace)
		if err != nil || g < 0 {
			return nil, bad("grace %q: want a duration such as 10s", d.Grace)
		}
		s.grace = g
	}
	switch d.CatchUp {
	case "":
		s.CatchUp = CatchUpLatest
	case CatchUpLatest, CatchUpAll, CatchUpSkip:
	default:
		return nil, bad("catchup %q: want latest, all or skip", d.CatchUp)
	}
	// Two occurrences closer than MinInterval anywhere in the next few
	// gaps means an expression such as "* * * * * *" (every second is
	// the limit, kept) or "@every 100ms".
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
	first := s.next(t)
	if first.IsZero() {
		return nil, bad("cron %q: has no occurrence", d.Cron)
	}
	if second := s.next(first); !second.IsZero() && second.Sub(first) < MinInterval {
		return nil, bad("cron %q: occurrences %s apart; the shortest gap is %s", d.Cron, second.Sub(first), MinInterval)
	}
	return s, nil
}

// allHours is the hour field of an expression that runs every hour.
const allHours = 1<<24 - 1

// next is the first occurrence strictly after t, truncated to the ms (the
// contract's score), or the zero time if there is none.
//
// Daylight saving time, as cron (Vixie/ISC) does it: an expression whose
// hour field is every hour, and @every, run by elapsed time, so an hourly
// job runs in both passes of a repeated hour and not in an hour that was
// skipped. An expression with fixed hours (a daily 02:30) runs once per
// wall-clock time it names: once in a repeated hour (the first pass), and
// at the moment of the jump for a time a spring-forward skips (02:30 in
// Europe/Berlin on the last Sunday of March runs at 03:00 CEST). robfig's
// parser reads the expression; its Next alone would run a daily 02:30
// twice on the autumn day and not at all on the spring day.
func (s *Schedule) next(t time.Time) time.Time {
	if s.wall == nil {
		n := s.cron.Next(t.In(s.loc))
		if n.IsZero() {
			return n
		}
		return n.Truncate(time.Millisecond)
	}
	base := naive(t.In(s.loc))
	for range 10_000 {
		w := s.wall.Next(base)
		if w.IsZero() {
			return w
		}
		if at := instant(w, s.loc); at.After(t) {
			return at.Truncate(time.Millisecond)
		}
		base = w // a wall time of the repeated hour's first pass, or one a jump folded onto an earlier one
	}
	return time.Time{}
}

// naive is t's wall-clock reading as a UTC time.
func naive(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

// instant is the first instant loc's clock shows the wall time w (given
// as UTC), or, if a jump forward skips it, the instant of the jump.
func instant(w time.Time, loc *time.Location) time.Time {
	var first time.Time
	for _, probe := range []time.Duration{-24 * time.Hour, 24 * time.Hour} {
		_, off := w.Add(probe).In(loc).Zone()
		at := w.Add(-time.Duration(off) * time.Second)
		if naive(at.In(loc)).Equal(w) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	if !first.IsZero() {
		return first
	}
	// Skipped: the zone period that starts after the jump begins at it.
	_, before := w.Add(-24 * time.Hour).In(loc).Zone()
	start, _ := w.Add(-time.Duration(before) * time.Second).In(loc).ZoneBounds()
	return start
}

// NextAfter is the first occurrence strictly after t.
func (s *Schedule) NextAfter(t time.Time) time.Time { return s.next(t) }

// Grace is how late an occurrence may be and still count as on time.
func (s *Schedule) GraceDuration() time.Duration { return s.grace }
