package scanner

import (
	"reflect"
	"testing"
)

// TestSplitUnroutable: returned tasks under UNROUTABLE=dead-letter are
// poison, in the batch's fail call when their attempts are MAX_ATTEMPTS,
// in a call of their own otherwise; other fails are left as they are.
func TestSplitUnroutable(t *testing.T) {
	fails := []outcome{{"1:a", "retry", "nack"}, {"1:b", outUnroutable, "unroutable: x"}, {"1:c", "poison", "refused"}}
	for _, c := range []struct {
		attempts  int
		rest, own []outcome
	}{
		{0, []outcome{{"1:a", "retry", "nack"}, {"1:b", "poison", "unroutable: x"}, {"1:c", "poison", "refused"}}, nil},
		{5, []outcome{{"1:a", "retry", "nack"}, {"1:b", "poison", "unroutable: x"}, {"1:c", "poison", "refused"}}, nil},
		{2, []outcome{{"1:a", "retry", "nack"}, {"1:c", "poison", "refused"}}, []outcome{{"1:b", "poison", "unroutable: x"}}},
	} {
		s := &Scanner{opt: Options{MaxAttempts: 5, Unroutable: UnroutableDeadLetter, UnroutableAttempts: c.attempts}}
		rest, own := s.splitUnroutable(fails)
		if !reflect.DeepEqual(rest, c.rest) || !reflect.DeepEqual(own, c.own) {
			t.Errorf("attempts %d: rest %v own %v, want %v %v", c.attempts, rest, own, c.rest, c.own)
		}
	}
	if fails[1].mode != outUnroutable {
		t.Error("the batch's own outcomes were changed")
	}
}
