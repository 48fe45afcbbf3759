package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeCgroupV1 makes base/cpu look like a cgroup v1 cpu controller's
// mount: a file the controller has.
func fakeCgroupV1(t *testing.T) (base, root string) {
	t.Helper()
	base = t.TempDir()
	root = filepath.Join(base, "cpu")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "cpu.cfs_quota_us"), []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return base, root
}

func TestQuotaFor(t *testing.T) {
	if q, err := quotaFor(0.1, 10*time.Millisecond); err != nil || q != 1000 {
		t.Errorf("0.1 of 10ms: %d, %v; want 1000", q, err)
	}
	if q, err := quotaFor(1.5, 100*time.Millisecond); err != nil || q != 150000 {
		t.Errorf("1.5 of 100ms: %d, %v; want 150000", q, err)
	}
	// Under the kernel's 1 ms: refused, with the period that would do.
	_, err := quotaFor(0.05, 10*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "-cpu-cap 0.05 with -cpu-period 10ms: a quota of 500 µs") ||
		!strings.Contains(err.Error(), "at least 20ms") {
		t.Errorf("0.05 of 10ms: %v", err)
	}
}

func TestFindCPUController(t *testing.T) {
	base, root := fakeCgroupV1(t)
	if got, v, err := findCPUController(base); err != nil || got != root || v != 1 {
		t.Errorf("v1: %q v%d %v", got, v, err)
	}

	// Nothing: the error names both paths looked at.
	empty := t.TempDir()
	_, _, err := findCPUController(empty)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(empty, "cpu", "cpu.cfs_quota_us")) ||
		!strings.Contains(err.Error(), filepath.Join(empty, "cgroup.controllers")) {
		t.Errorf("none: %v", err)
	}

	// cgroup v2: cpu must be available and enabled for the children.
	v2 := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(v2, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cgroup.controllers", "cpuset io memory pids\n")
	if _, _, err := findCPUController(v2); err == nil || !strings.Contains(err.Error(), "has no cpu controller") {
		t.Errorf("v2 without cpu: %v", err)
	}
	write("cgroup.controllers", "cpuset cpu io memory pids\n")
	write("cgroup.subtree_control", "memory pids\n")
	if _, _, err := findCPUController(v2); err == nil || !strings.Contains(err.Error(), "echo +cpu > "+filepath.Join(v2, "cgroup.subtree_control")) {
		t.Errorf("v2 with cpu not enabled below: %v", err)
	}
	write("cgroup.subtree_control", "cpu memory pids\n")
	if got, v, err := findCPUController(v2); err != nil || got != v2 || v != 2 {
		t.Errorf("v2: %q v%d %v", got, v, err)
	}
}

func TestCPULimiterNeedsRoot(t *testing.T) {
	base, root := fakeCgroupV1(t)
	_, err := newCPULimiter(base, 0.1, 10*time.Millisecond, 1000)
	if err == nil || !strings.Contains(err.Error(), "needs root") || !strings.Contains(err.Error(), root) || !strings.Contains(err.Error(), "uid 1000") {
		t.Errorf("not root: %v", err)
	}
}

// With a temporary directory standing in for the cgroup root: the limits
// are written and read back, the cgroups removed; a value the "kernel"
// does not keep (a file that reads back empty) fails, naming the file and
// the value.
func TestCgroupLimitsReadBack(t *testing.T) {
	base, root := fakeCgroupV1(t)
	// A stale cgroup of a bench that is gone (pid 0 never is one), and
	// one of a live process, which stays.
	stale := filepath.Join(root, "dispatcher-bench-999999999-3")
	live := filepath.Join(root, "dispatcher-bench-1-1")
	for _, d := range []string{stale, live} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel drops a cgroup's files with it; a directory does not.
	rmdir = func(dir string) error {
		for _, f := range []string{"cpu.cfs_period_us", "cpu.cfs_quota_us"} {
			os.Remove(filepath.Join(dir, f))
		}
		return os.Remove(dir)
	}
	t.Cleanup(func() { rmdir = os.Remove })
	l, err := newCPULimiter(base, 0.25, 20*time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale cgroup left: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live bench's cgroup was removed: %v", err)
	}
	if c := l.cap; c.PeriodUs != 20000 || c.QuotaUs != 5000 || c.Cores != 0.25 || c.Version != 1 || c.Root != root {
		t.Errorf("cap %+v", c)
	}
	g, err := l.make()
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"cpu.cfs_period_us": "20000\n", "cpu.cfs_quota_us": "5000\n"} {
		if b, err := os.ReadFile(filepath.Join(g.dir, file)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", file, b, err, want)
		}
	}
	if !strings.HasPrefix(filepath.Base(g.dir), "dispatcher-bench-") {
		t.Errorf("cgroup %s", g.dir)
	}
	if err := l.removeAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.dir); !os.IsNotExist(err) {
		t.Errorf("cgroup %s not removed: %v", g.dir, err)
	}

	// The kernel refusing a value: it reads back as something else.
	dir := t.TempDir()
	quota := filepath.Join(dir, "cpu.cfs_quota_us")
	if err := os.Symlink(os.DevNull, quota); err != nil {
		t.Fatal(err)
	}
	err = setLimits(dir, 1, 10000, 1000)
	if err == nil || !strings.Contains(err.Error(), "wrote 1000 to "+quota) || !strings.Contains(err.Error(), "uncapped") {
		t.Errorf("refused quota: %v", err)
	}
	// cgroup v2: one file, "quota period".
	if err := setLimits(dir, 2, 10000, 1000); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cpu.max")); string(b) != "1000 10000\n" {
		t.Errorf("cpu.max %q", b)
	}
}

func TestCgroupFiles(t *testing.T) {
	v1 := "12:pids:/\n4:cpu,cpuacct:/dispatcher-bench-7-2\n3:cpuset:/\n0::/user.slice\n"
	if p, ok := cpuCgroupOf(v1, 1); !ok || p != "/dispatcher-bench-7-2" {
		t.Errorf("v1: %q %v", p, ok)
	}
	if p, ok := cpuCgroupOf(v1, 2); !ok || p != "/user.slice" {
		t.Errorf("v2: %q %v", p, ok)
	}
	if _, ok := cpuCgroupOf("3:cpuset:/\n", 1); ok {
		t.Error("v1 without cpu found one")
	}
	got := parseCPUStat("nr_periods 310\nnr_throttled 62\nthrottled_time 1200000000\n")
	if got != (Throttle{Periods: 310, Throttled: 62, ThrottledSeconds: 1.2}) {
		t.Errorf("v1 cpu.stat: %+v", got)
	}
	got = parseCPUStat("usage_usec 5\nnr_periods 10\nnr_throttled 4\nthrottled_usec 2500000\n")
	if got != (Throttle{Periods: 10, Throttled: 4, ThrottledSeconds: 2.5}) {
		t.Errorf("v2 cpu.stat: %+v", got)
	}
	if d := got.minus(Throttle{Periods: 4, Throttled: 1, ThrottledSeconds: 0.5}); d != (Throttle{Periods: 6, Throttled: 3, ThrottledSeconds: 2}) {
		t.Errorf("minus: %+v", d)
	}
}
