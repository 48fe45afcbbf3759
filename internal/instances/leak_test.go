package instances

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine must have a stop signal and someone who waits for it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
