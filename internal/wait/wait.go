// Package wait holds the one context-aware sleep the daemon and the bench
// share.
package wait

import (
	"context"
	"time"
)

// For waits d, or less if ctx ends first; it reports whether d passed.
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
