package scanner

import "github.com/dispatcher/dispatcher/shard"

// checkScore counts and warns of (once per 10 s) a task of shard i whose
// due time a producer got wrong, as it is published: in seconds, or
// undated (0, negative, -inf, seconds before 1973). Both go out at once.
// It returns the due time the producer meant, for the lateness metric;
// ok is false for an undated task, whose lateness is not known.
func (s *Scanner) checkScore(i int, t Task) (meant int64, ok bool) {
	meant, ok = shard.MeantMs(t.DueMs)
	switch {
	case !ok:
		s.met.undatedScore(1)
		s.lim.Warn("undated", "task scored 0 or less, -inf, or in seconds before 1973: it has no real due time; dispatching it now as due",
			"shard", i, "key", s.keys.Pending(i), "member", shard.ShortMember(string(t.Member), 64), "score", t.DueMs)
	case shard.LooksLikeSeconds(t.DueMs):
		s.met.secondsScore(1)
		s.lim.Warn("seconds", "score looks like seconds since the epoch, not milliseconds; dispatching it now as due",
			"shard", i, "key", s.keys.Pending(i), "member", shard.ShortMember(string(t.Member), 64), "score", t.DueMs)
	}
	return meant, ok
}
