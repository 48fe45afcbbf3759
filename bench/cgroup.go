package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cgroupBase is where the cgroup hierarchies are mounted.
const cgroupBase = "/sys/fs/cgroup"

// minQuotaUs is the smallest CFS quota the kernel takes; it refuses a
// smaller one, and the process would then run uncapped.
const minQuotaUs = 1000

// CPUCap is the CPU cap in force on each dispatcher instance (and on the
// floor's publisher), as -cpu-cap set it and the kernel read it back: a
// cgroup of each, with a CFS quota of QuotaUs every PeriodUs.
type CPUCap struct {
	Cores    float64 `json:"cores"` // QuotaUs / PeriodUs: the share of one core
	PeriodUs int64   `json:"period_us"`
	QuotaUs  int64   `json:"quota_us"`
	Root     string  `json:"cgroup_root"` // where the cgroups were made
	Version  int     `json:"cgroup_version"`
}

func (c *CPUCap) String() string {
	return fmt.Sprintf("%.3g of a core per process (cgroup v%d: %d µs every %d µs, under %s)",
		c.Cores, c.Version, c.QuotaUs, c.PeriodUs, c.Root)
}

// cpuLimiter makes a cgroup for each capped child process and removes it
// when the child is done.
type cpuLimiter struct {
	cap    CPUCap
	prefix string // dispatcher-bench-<pid>-
	seq    atomic.Int64

	mu   sync.Mutex
	live map[string]bool // cgroups made and not removed yet
}

// quotaFor is the quota of a cap of cores per period, refused when the
// kernel would refuse it.
func quotaFor(cores float64, period time.Duration) (int64, error) {
	periodUs := period.Microseconds()
	q := int64(cores*float64(periodUs) + 0.5)
	if q < minQuotaUs {
		return 0, fmt.Errorf("-cpu-cap %g with -cpu-period %s: a quota of %d µs, under the kernel's minimum of %d µs; give a -cpu-period of at least %s",
			cores, period, q, minQuotaUs, time.Duration(float64(minQuotaUs)/cores+0.5)*time.Microsecond)
	}
	return q, nil
}

// findCPUController returns where cgroups with a CPU quota are made under
// base: the cgroup v1 cpu controller's mount (base/cpu), or the cgroup v2
// root (base itself) when it has the cpu controller enabled for its
// children.
func findCPUController(base string) (root string, version int, err error) {
	v1 := filepath.Join(base, "cpu")
	if _, err := os.Stat(filepath.Join(v1, "cpu.cfs_quota_us")); err == nil {
		return v1, 1, nil
	}
	ctrl, err := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
	if err != nil {
		return "", 0, fmt.Errorf("-cpu-cap: no cpu cgroup controller: neither %s (cgroup v1) nor %s (cgroup v2) is there",
			filepath.Join(v1, "cpu.cfs_quota_us"), filepath.Join(base, "cgroup.controllers"))
	}
	if !hasWord(string(ctrl), "cpu") {
		return "", 0, fmt.Errorf("-cpu-cap: cgroup v2 at %s has no cpu controller (%s: %q)",
			base, filepath.Join(base, "cgroup.controllers"), strings.TrimSpace(string(ctrl)))
	}
	sub, err := os.ReadFile(filepath.Join(base, "cgroup.subtree_control"))
	if err != nil {
		return "", 0, fmt.Errorf("-cpu-cap: cgroup v2: %w", err)
	}
	if !hasWord(string(sub), "cpu") {
		return "", 0, fmt.Errorf("-cpu-cap: cgroup v2: the cpu controller is not enabled for the children of %s (%s: %q); enable it with: echo +cpu > %s",
			base, filepath.Join(base, "cgroup.subtree_control"), strings.TrimSpace(string(sub)), filepath.Join(base, "cgroup.subtree_control"))
	}
	return base, 2, nil
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

// newCPULimiter finds the cpu controller under base, makes sure this
// process may make cgroups there (euid 0), removes what earlier benches
// that were killed left there, and tries a cgroup with the limits once,
// so that a cap the kernel will not take fails before anything runs.
func newCPULimiter(base string, cores float64, period time.Duration, euid int) (*cpuLimiter, error) {
	quota, err := quotaFor(cores, period)
	if err != nil {
		return nil, err
	}
	root, version, err := findCPUController(base)
	if err != nil {
		return nil, err
	}
	if euid != 0 {
		return nil, fmt.Errorf("-cpu-cap: making cgroups under %s needs root; running as uid %d", root, euid)
	}
	l := &cpuLimiter{
		cap:    CPUCap{PeriodUs: period.Microseconds(), QuotaUs: quota, Cores: float64(quota) / float64(period.Microseconds()), Root: root, Version: version},
		prefix: fmt.Sprintf("dispatcher-bench-%d-", os.Getpid()),
		live:   map[string]bool{},
	}
	removeStale(root)
	g, err := l.make()
	if err != nil {
		return nil, err
	}
	if err := l.remove(g); err != nil {
		return nil, err
	}
	return l, nil
}

// removeStale removes the empty cgroups of benches no longer running
// (dispatcher-bench-<pid>-<n> of a pid that is gone): a bench killed
// outright leaves its own behind.
func removeStale(root string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "dispatcher-bench-")
		if !ok || !e.IsDir() {
			continue
		}
		pid, _, _ := strings.Cut(rest, "-")
		if n, err := strconv.Atoi(pid); err != nil || n == os.Getpid() {
			continue
		} else if _, err := os.Stat(fmt.Sprintf("/proc/%d", n)); err == nil {
			continue
		}
		_ = rmdir(filepath.Join(root, e.Name())) // fails if a process is still in it
	}
}

// cgroup is one capped child's cgroup.
type cgroup struct {
	dir     string
	version int
	root    string
}

// make creates a cgroup with the limits and reads them back.
func (l *cpuLimiter) make() (*cgroup, error) {
	dir := filepath.Join(l.cap.Root, l.prefix+strconv.FormatInt(l.seq.Add(1), 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-cpu-cap: make cgroup: %w", err)
	}
	g := &cgroup{dir: dir, version: l.cap.Version, root: l.cap.Root}
	l.mu.Lock()
	l.live[dir] = true
	l.mu.Unlock()
	if err := setLimits(dir, l.cap.Version, l.cap.PeriodUs, l.cap.QuotaUs); err != nil {
		_ = l.remove(g)
		return nil, err
	}
	return g, nil
}

// setLimits writes the period and quota into the cgroup at dir and reads
// them back: the kernel may refuse a value (a quota under 1 ms) and leave
// the process uncapped.
func setLimits(dir string, version int, periodUs, quotaUs int64) error {
	if version == 2 {
		want := fmt.Sprintf("%d %d", quotaUs, periodUs)
		return writeChecked(filepath.Join(dir, "cpu.max"), want)
	}
	// The period first: a new cgroup's quota is -1 (none), which any
	// period takes.
	if err := writeChecked(filepath.Join(dir, "cpu.cfs_period_us"), strconv.FormatInt(periodUs, 10)); err != nil {
		return err
	}
	return writeChecked(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(quotaUs, 10))
}

// writeChecked writes value to a cgroup file and reads it back.
func writeChecked(path, value string) error {
	if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
		return fmt.Errorf("-cpu-cap: write %s to %s: %w", value, path, err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-cpu-cap: read back %s: %w", path, err)
	}
	if g := strings.TrimSpace(string(got)); g != value {
		return fmt.Errorf("-cpu-cap: wrote %s to %s, it reads %q: the kernel did not take it, the process would run uncapped", value, path, g)
	}
	return nil
}

// remove removes the cgroup once its process has gone (a process that
// has just exited may take a moment to leave it).
func (l *cpuLimiter) remove(g *cgroup) error {
	var err error
	for try := 0; try < 50; try++ {
		if err = rmdir(g.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			l.mu.Lock()
			delete(l.live, g.dir)
			l.mu.Unlock()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("-cpu-cap: remove cgroup: %w", err)
}

// rmdir removes a cgroup: the kernel drops its files with it (a test's
// stand-in directory needs them removed first).
var rmdir = os.Remove

// removeAll removes every cgroup still there (after an error or an
// interrupt), and says which it could not.
func (l *cpuLimiter) removeAll() error {
	l.mu.Lock()
	var dirs []string
	for d := range l.live {
		dirs = append(dirs, d)
	}
	l.mu.Unlock()
	var errs []error
	for _, d := range dirs {
		errs = append(errs, l.remove(&cgroup{dir: d}))
	}
	return errors.Join(errs...)
}

// threadCgroup is the thread's cgroup in the v1 cpu hierarchy, relative
// to its mount.
func threadCgroup(tid int) (string, error) {
	path := fmt.Sprintf("/proc/self/task/%d/cgroup", tid)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("-cpu-cap: %w", err)
	}
	if p, ok := cpuCgroupOf(string(b), 1); ok {
		return p, nil
	}
	return "", fmt.Errorf("-cpu-cap: %s names no cpu cgroup", path)
}

// cpuCgroupOf reads the cgroup of the cpu controller (v1: the line whose
// controllers include cpu; v2: the 0:: line) from /proc/<pid>/cgroup.
func cpuCgroupOf(procCgroup string, version int) (string, bool) {
	for line := range strings.SplitSeq(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if version == 2 && f[0] == "0" && f[1] == "" {
			return f[2], true
		}
		if version == 1 {
			for c := range strings.SplitSeq(f[1], ",") {
				if c == "cpu" {
					return f[2], true
				}
			}
		}
	}
	return "", false
}

// holds checks that the process is in the cgroup.
func (g *cgroup) holds(pid int) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("-cpu-cap: check pid %d's cgroup: %w", pid, err)
	}
	p, ok := cpuCgroupOf(string(b), g.version)
	if !ok || filepath.Base(p) != filepath.Base(g.dir) {
		return fmt.Errorf("-cpu-cap: pid %d is in cpu cgroup %q, not in %s: it would run uncapped", pid, p, g.dir)
	}
	return nil
}

// Throttle is what the kernel's CFS did to one capped process: the
// periods in which it ran, those in which it used up its quota and was
// held, and for how long in all.
type Throttle struct {
	Periods          int64   `json:"periods"`
	Throttled        int64   `json:"throttled_periods"`
	ThrottledSeconds float64 `json:"throttled_seconds"`
}

// throttle reads the cgroup's cpu.stat.
func (g *cgroup) throttle() (Throttle, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	if err != nil {
		return Throttle{}, fmt.Errorf("-cpu-cap: %w", err)
	}
	return parseCPUStat(string(b)), nil
}

// parseCPUStat reads cpu.stat: v1 gives throttled_time in ns, v2
// throttled_usec.
func parseCPUStat(s string) Throttle {
	var t Throttle
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "nr_periods":
			t.Periods = n
		case "nr_throttled":
			t.Throttled = n
		case "throttled_time":
			t.ThrottledSeconds = float64(n) / 1e9
		case "throttled_usec":
			t.ThrottledSeconds = float64(n) / 1e6
		}
	}
	return t
}

// minus is t less an earlier reading.
func (t Throttle) minus(before Throttle) Throttle {
	return Throttle{Periods: t.Periods - before.Periods, Throttled: t.Throttled - before.Throttled,
		ThrottledSeconds: t.ThrottledSeconds - before.ThrottledSeconds}
}
