package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// Probe pacing: a producer ZADD every 2 ms, a stats read every 200 ms.
const (
	zaddEvery  = 2 * time.Millisecond
	statsEvery = 200 * time.Millisecond
)

// probeFlag, as `dispatcher bench`'s first argument, runs the probe
// process of a burst point instead of a bench (probeMain).
const probeFlag = "-probe"

// probeRun is a burst point's running probe process.
type probeRun struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	out      bytes.Buffer
	errOut   bytes.Buffer
	shards   int
	dueLocal time.Time
}

// probed is what the probe process measured, in µs.
type probed struct {
	before, during, stats []int32
	zadds                 []int64 // by shard
}

// startProbe starts the probe process: the dispatcher executable (this
// one, or -dispatcher's) run as `bench -probe`, on -probe-cpus if given.
func (r *runner) startProbe(m *measurement, farMs int64, dueLocal time.Time) (*probeRun, error) {
	args := []string{r.opt.Dispatcher, "bench", probeFlag, "-redis", r.opt.RedisURL, "-prefix", m.keys.Prefix,
		"-queue", m.keys.Queue, "-shards", strconv.Itoa(m.p.Shards), "-far-ms", strconv.FormatInt(farMs, 10),
		"-stats-from", strconv.FormatInt(dueLocal.UnixNano(), 10)}
	if r.opt.ProbeCPUs != "" {
		args = append([]string{"taskset", "-c", r.opt.ProbeCPUs}, args...)
	}
	pr := &probeRun{cmd: exec.Command(args[0], args[1:]...), shards: m.p.Shards, dueLocal: dueLocal}
	pr.cmd.Stdout, pr.cmd.Stderr = &pr.out, &pr.errOut
	pr.cmd.SysProcAttr = childAttr()
	var err error
	if pr.stdin, err = pr.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := pr.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the probe process %s: %w", args[0], err)
	}
	return pr, nil
}

// stop ends the probe process (it stops when its stdin closes) and reads
// what it measured.
func (pr *probeRun) stop() (probed, error) {
	pr.stdin.Close()
	err := pr.cmd.Wait()
	if err != nil {
		return probed{}, fmt.Errorf("probe process: %w: %s", err, strings.TrimSpace(pr.errOut.String()))
	}
	return parseProbed(pr.out.String(), pr.shards, pr.dueLocal)
}

// parseProbed reads the probe's lines: "z SHARD START_NS US" per ZADD and
// "s START_NS US" per stats read.
func parseProbed(out string, shards int, dueLocal time.Time) (probed, error) {
	p := probed{zadds: make([]int64, shards)}
	due := dueLocal.UnixNano()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		nums := make([]int64, len(f)-1)
		for i, s := range f[1:] {
			var err error
			if nums[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				return p, fmt.Errorf("probe process: bad line %q", line)
			}
		}
		switch {
		case f[0] == "z" && len(nums) == 3 && nums[0] >= 0 && int(nums[0]) < shards:
			p.zadds[nums[0]]++
			if nums[1] < due {
				p.before = append(p.before, int32(nums[2]))
			} else {
				p.during = append(p.during, int32(nums[2]))
			}
		case f[0] == "s" && len(nums) == 2:
			p.stats = append(p.stats, int32(nums[1]))
		default:
			return p, fmt.Errorf("probe process: bad line %q", line)
		}
	}
	return p, nil
}

// probeMain is the probe process: until its stdin closes, it ZADDs one
// far-future task every 2 ms to the queue's shards in turn, each on its
// own round trip as a producer does, and from -stats-from on it reads the
// queue as `dispatcher stats` does every 200 ms; it prints one line per
// call (see parseProbed).
func probeMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dispatcher bench -probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("redis", "", "Redis URL")
	prefix := fs.String("prefix", "", "key prefix")
	queue := fs.String("queue", "", "queue")
	shards := fs.Int("shards", 1, "shards")
	farMs := fs.Int64("far-ms", 0, "the probe tasks' due time")
	statsFrom := fs.Int64("stats-from", 0, "Unix ns from which stats are read")
	if err := fs.Parse(args); err != nil {
		return exitSettings
	}
	opt, err := redisconn.Parse(*url)
	if err != nil {
		fmt.Fprintf(stderr, "probe: -redis: %v\n", err)
		return exitSettings
	}
	rdb := opt.NewClient()
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, stdin); cancel() }()

	w := bufio.NewWriter(stdout)
	var mu sync.Mutex
	emit := func(format string, a ...any) {
		mu.Lock()
		fmt.Fprintf(w, format, a...)
		mu.Unlock()
	}
	keys := shard.Keys{Prefix: *prefix, Queue: *queue}
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(zaddEvery)
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			i := n % *shards
			start := time.Now()
			// A member the recorder does not count as a bench task.
			err := rdb.ZAdd(ctx, keys.Pending(i), redis.Z{Score: float64(*farMs), Member: "probe-" + strconv.Itoa(n)}).Err()
			if err == nil {
				emit("z %d %d %d\n", i, start.UnixNano(), time.Since(start).Microseconds())
			}
		}
	})
	wg.Go(func() {
		if !sleepCtx(ctx, time.Until(time.Unix(0, *statsFrom))) {
			return
		}
		t := time.NewTicker(statsEvery)
		defer t.Stop()
		targets := []queuestate.Target{{Name: *queue, Shards: *shards}}
		for {
			start := time.Now()
			if _, err := queuestate.Read(ctx, rdb, *prefix, targets); err == nil {
				emit("s %d %d\n", start.UnixNano(), time.Since(start).Microseconds())
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Wait()
	if err := w.Flush(); err != nil {
		fmt.Fprintf(stderr, "probe: %v\n", err)
		return exitFailure
	}
	return exitOK
}
