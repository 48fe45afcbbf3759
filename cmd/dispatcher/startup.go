package main

import (
	"fmt"
	"sync"
	"time"
)

// startup is what the start of the process waits for, for /readyz and the
// status page: the endpoint serves from the first moment, while the start
// may wait for Redis for as long as it is away.
type startup struct {
	since time.Time

	mu   sync.Mutex
	what string // what the start waits for ("Redis"); "" once started
	why  string // the latest error, passwords removed
	done bool
}

// waitingFor notes that the start waits for what, because of why.
func (s *startup) waitingFor(what string, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.what, s.why = what, fmt.Sprint(why)
}

// started notes that the start is over: the instance dispatches.
func (s *startup) started() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.what, s.why, s.done = "", "", true
}

// problem describes the start while it is not over ("" once it is):
// "starting: waiting for Redis for 12s (last error: ...)".
func (s *startup) problem() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return ""
	}
	if s.what == "" {
		return "starting: checking Redis"
	}
	return fmt.Sprintf("starting: waiting for %s for %s (last error: %s)", s.what, time.Since(s.since).Round(time.Second), s.why)
}
