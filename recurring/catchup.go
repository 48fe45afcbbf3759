package recurring

import "time"

// The catch-up after an outage picks the occurrence to materialise when
// the one after the cursor is older than the grace. Its work must not grow
// with the outage: a schedule may be a year behind (31 M occurrences of
// @every 1s). An @every schedule's occurrences are its first after the
// cursor plus whole gaps, so the choice is arithmetic. A cron expression's
// next from any instant is the first occurrence after it, so the latest
// occurrence at or before now is found by bisection, and the most recent
// MaxCatchUp by walking windows that end at now, never the whole outage.

// countLimit bounds the walk that counts a cron expression's skipped
// occurrences (an @every schedule's are counted by arithmetic): beyond it
// the count is a floor, and the log says so.
const countLimit = 10 * MaxCatchUp

// windowLimit bounds each window walked for the "all" policy: a window
// holding between MaxCatchUp and windowLimit occurrences gives the answer.
const windowLimit = 4 * MaxCatchUp

// catchUp is following's choice.
type catchUp struct {
	at      time.Time // the occurrence to materialise; zero: the expression has no further one
	skipped int       // missed occurrences that will not fire
	floor   bool      // skipped is a floor: counting stopped at countLimit
	// lost: the policy's occurrence could not be found (the expression's
	// next contradicted itself); at is the first occurrence after now, so
	// that nothing stale fires, and the materialiser logs it.
	lost bool
}

// following picks the occurrence to materialise after the one at cursor
// (already materialised), at now, by the catch-up policy: the one after
// cursor if it is not older than the grace, else the policy's choice among
// the occurrences after cursor up to now.
func (s *Schedule) following(cursor, now time.Time) catchUp {
	n := s.next(cursor)
	if n.IsZero() || !n.Before(now.Add(-s.grace)) {
		return catchUp{at: n}
	}
	last, ok := s.latest(cursor, n, now)
	if !ok {
		return s.lostAt(n, now)
	}
	var c catchUp
	switch s.CatchUp {
	case CatchUpAll:
		first, ok := s.firstOfLast(cursor, n, last, now)
		if !ok {
			return s.lostAt(n, now)
		}
		c.at = first
		c.skipped, c.floor = s.countBefore(n, first)
	case CatchUpSkip:
		// The first one after now in the cursor's sequence (keeps an
		// @every schedule's phase).
		c.at = s.next(last)
		c.skipped, c.floor = s.countBefore(n, last.Add(time.Nanosecond))
	default: // latest
		c.at = last
		c.skipped, c.floor = s.countBefore(n, last)
	}
	return c
}

// latest is the last occurrence at or before now, n being the first after
// cursor (at or before now). ok is false if the search contradicts itself.
func (s *Schedule) latest(cursor, n, now time.Time) (time.Time, bool) {
	if s.every > 0 {
		return n.Add(now.Sub(n) / s.every * s.every), true
	}
	// Bisect on "an occurrence is in (p, now]": true at the cursor, false
	// at now, it turns false at the last occurrence. In whole ms, as the
	// occurrences are: about 40 steps for decades.
	lo, hi := cursor.UnixMilli(), now.UnixMilli()
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if t := s.next(ms(mid)); !t.IsZero() && !t.After(now) {
			lo = mid
		} else {
			hi = mid
		}
	}
	last := s.next(ms(lo))
	after := s.next(last)
	ok := !last.IsZero() && !last.Before(n) && !last.After(now) && (after.IsZero() || after.After(now))
	return last, ok
}

// firstOfLast is the first of the most recent MaxCatchUp occurrences at or
// before now, or n if there are no more after cursor; n is the first after
// cursor and last the latest at or before now.
func (s *Schedule) firstOfLast(cursor, n, last, now time.Time) (time.Time, bool) {
	if s.every > 0 {
		if last.Sub(n)/s.every >= MaxCatchUp {
			return last.Add(-(MaxCatchUp - 1) * s.every), true
		}
		return n, true
	}
	// Walk windows (p, now] until one holds between MaxCatchUp and
	// windowLimit occurrences: from the cursor first (a short outage, and
	// every step of a catch-up once the kept ones are reached), then back
	// from now by twice MaxCatchUp mean gaps (of the occurrences that first
	// walk saw), doubled while a window holds too few, bisected once one
	// held too many. Times in ms: 2,000 yearly gaps are past time.Duration.
	keep := func(kept []time.Time) (time.Time, bool) {
		return kept[0], kept[len(kept)-1].Equal(last) // the window ends at the latest, or the search contradicts itself
	}
	kept, seen, done := s.window(cursor, now, windowLimit)
	if done {
		if seen <= MaxCatchUp {
			return n, true // all of them fire
		}
		return keep(kept)
	}
	gap := max(kept[len(kept)-1].Sub(n).Milliseconds()/int64(seen-1), 1000)
	width := 2 * MaxCatchUp * gap
	lo, hi := cursor.UnixMilli(), now.UnixMilli() // (lo, now] holds too many, (hi, now] too few
	p, widening := hi-width, true
	for hi-lo > 1 {
		if p <= lo || p >= hi {
			p, widening = lo+(hi-lo)/2, false
		}
		kept, seen, done := s.window(ms(p), now, windowLimit)
		switch {
		case done && seen >= MaxCatchUp:
			return keep(kept)
		case done:
			hi = p
		default:
			lo, widening = p, false
		}
		if widening {
			width *= 2
			p = hi - width
		} else {
			p = lo + (hi-lo)/2
		}
	}
	return time.Time{}, false
}

// window walks the occurrences after p up to now, at most limit of them,
// keeping the last MaxCatchUp (oldest first). done: there are no more up
// to now.
func (s *Schedule) window(p, now time.Time, limit int) (kept []time.Time, seen int, done bool) {
	t := s.next(p)
	for ; !t.IsZero() && !t.After(now) && seen < limit; t = s.next(t) {
		seen++
		kept = append(kept, t)
		if len(kept) == 2*MaxCatchUp {
			kept = kept[:copy(kept, kept[MaxCatchUp:])]
		}
	}
	if len(kept) > MaxCatchUp {
		kept = kept[len(kept)-MaxCatchUp:]
	}
	return kept, seen, t.IsZero() || t.After(now)
}

// countBefore counts the occurrences from `from` (one) up to end, not
// including it: for a cron expression at most countLimit (floor: it
// stopped there).
func (s *Schedule) countBefore(from, end time.Time) (int, bool) {
	if !from.Before(end) {
		return 0, false
	}
	if s.every > 0 {
		k := end.Sub(from) / s.every
		if from.Add(k * s.every).Before(end) {
			k++
		}
		return int(k), false
	}
	k := 0
	for t := from; !t.IsZero() && t.Before(end); t = s.next(t) {
		if k == countLimit {
			return k, true
		}
		k++
	}
	return k, false
}

// lostAt gives the policy's choice up: the first occurrence after now, so
// that nothing stale fires; every one from n up to now is skipped.
func (s *Schedule) lostAt(n, now time.Time) catchUp {
	c := catchUp{at: s.next(now), lost: true}
	c.skipped, c.floor = s.countBefore(n, now.Add(time.Nanosecond))
	return c
}
