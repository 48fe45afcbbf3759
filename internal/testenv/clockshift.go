package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// ClockShift steps the wall clock of private servers started with its Env
// (RedisOptions.Env): the preload testdata/clockshift.c, built with the
// machine's C compiler, adds the shift it is set to to every reading of
// CLOCK_REALTIME, as an NTP step or a failover to a server whose clock is
// off would. Monotonic clocks are left alone.
type ClockShift struct {
	file string
	Env  []string // LD_PRELOAD and CLOCK_SHIFT_FILE for the server's environment
}

// NewClockShift builds the preload (gcc: scripts/dev.sh installs it) and
// starts with no shift.
func NewClockShift(t testing.TB) *ClockShift {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the clock-shift preload is built for Linux only")
	}
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "testdata", "clockshift.c")
	dir := t.TempDir()
	so := filepath.Join(dir, "clockshift.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("build the clock-shift preload (gcc, from scripts/dev.sh): %v: %s", err, out)
	}
	c := &ClockShift{file: filepath.Join(dir, "shift")}
	c.Env = []string{"LD_PRELOAD=" + so, "CLOCK_SHIFT_FILE=" + c.file}
	c.Set(t, 0)
	return c
}

// Set makes the servers' wall clock read d off the real one from now on
// (negative: behind). The file is replaced whole, so that no reading sees
// it half written.
func (c *ClockShift) Set(t testing.TB, d time.Duration) {
	t.Helper()
	tmp := c.file + ".new"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(d.Microseconds(), 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, c.file); err != nil {
		t.Fatal(err)
	}
}
