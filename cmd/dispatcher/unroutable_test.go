package main

import (
	"testing"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/scanner"
)

// TestUnroutableModesAgree: the daemon hands a queue's UNROUTABLE to the
// scanner as it is, so both spell the modes alike.
func TestUnroutableModesAgree(t *testing.T) {
	for _, c := range [][2]string{{config.UnroutableRetry, scanner.UnroutableRetry},
		{config.UnroutableDeadLetter, scanner.UnroutableDeadLetter}, {config.UnroutableDrop, scanner.UnroutableDrop}} {
		if c[0] != c[1] {
			t.Errorf("config %q, scanner %q", c[0], c[1])
		}
	}
}
