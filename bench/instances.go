package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dispatcher/dispatcher/config"
)

// benchQueue is the queue name the instances serve; keys and exchange are
// unique per point through the key prefix and the exchange name.
const benchQueue = "bench"

// queueNames are the n queues an instance serves: the bench queue, then
// bench-2, bench-3, ... (valid queue names: 1-64 of A-Z a-z 0-9 _ . -).
func queueNames(n int) []string {
	out := []string{benchQueue}
	for i := 2; i <= n; i++ {
		out = append(out, fmt.Sprintf("%s-%d", benchQueue, i))
	}
	return out
}

// stampVar asks the instances to stamp every message with header
// x-published-us, for the dispatch view of lateness.
const stampVar = "DISPATCHER_STAMP_PUBLISHED"

// knowsSetting says whether the dispatcher executable lists the variable
// in its --help. A dispatcher refuses to start with a DISPATCHER_* it does
// not know, so a setting only newer ones have (DISPATCHER_STAMP_PUBLISHED)
// is passed only to one that lists it.
func knowsSetting(ctx context.Context, binary, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--help").Output()
	return err == nil && strings.Contains(string(out), name)
}

// instance is one dispatcher child process.
type instance struct {
	cmd  *exec.Cmd
	addr string // its /readyz and /metrics
	out  *tailBuffer
	done chan struct{}
	err  error // set when done is closed
	// With -cpu-cap: its cgroup, removed once it has stopped.
	cg  *cgroup
	lim *cpuLimiter
}

// instanceSpec says how to start the instances of one point.
type instanceSpec struct {
	binary     string
	redisURL   string
	amqpURL    string
	prefix     string
	exchange   string
	queues     []string // served, each with shards shards and exchange
	shards     int
	batch      int
	clientName string      // Redis client name prefix of the instances
	stamp      bool        // set DISPATCHER_STAMP_PUBLISHED=true
	maxRate    int         // each queue's MAX_RATE (0: none)
	limiter    *cpuLimiter // caps each instance's CPU (nil: no cap)
	// ingress, when set, is the first queue's ingress (ingress mode).
	ingress *ingressSpec
}

// ingressSpec is a queue's AMQP ingress as the instances are set up.
type ingressSpec struct {
	exchange  string // DISPATCHER_QUEUE_<NAME>_INGRESS_EXCHANGE
	queueType string // _INGRESS_QUEUE_TYPE: quorum or classic
	prefetch  int    // _INGRESS_PREFETCH
}

// Settings the bench sets itself; the parent's own values of these are not
// passed on. Every other DISPATCHER_* (e.g. DISPATCHER_PIPELINE) is, so a
// bench can try them.
var ownVars = []string{"DISPATCHER_REDIS_URL", "DISPATCHER_AMQP_URL", "DISPATCHER_AMQP_NODE_ORDER", "DISPATCHER_KEY_PREFIX",
	"DISPATCHER_QUEUES", "DISPATCHER_HTTP_ADDR", "DISPATCHER_BATCH_SIZE", "DISPATCHER_LOG_LEVEL",
	"DISPATCHER_QUEUE_", stampVar}

func (sp instanceSpec) env(n int, httpAddr string) ([]string, error) {
	var env []string
	for _, kv := range os.Environ() {
		own := false
		for _, v := range ownVars {
			own = own || strings.HasPrefix(kv, v)
		}
		if !own {
			env = append(env, kv)
		}
	}
	ru, err := withClientName(sp.redisURL, fmt.Sprintf("%s-%d", sp.clientName, n))
	if err != nil {
		return nil, err
	}
	queues := sp.queues
	if len(queues) == 0 {
		queues = []string{benchQueue}
	}
	env = append(env,
		"DISPATCHER_REDIS_URL="+ru,
		"DISPATCHER_AMQP_URL="+sp.amqpURL,
		// The first node, as the consumer and the raw publisher use.
		"DISPATCHER_AMQP_NODE_ORDER=listed",
		"DISPATCHER_KEY_PREFIX="+sp.prefix,
		"DISPATCHER_QUEUES="+strings.Join(queues, ","),
		"DISPATCHER_BATCH_SIZE="+strconv.Itoa(sp.batch),
		"DISPATCHER_HTTP_ADDR="+httpAddr,
		"DISPATCHER_LOG_LEVEL=warn",
	)
	for _, q := range queues {
		pre := config.QueuePrefix(q)
		env = append(env, pre+"_SHARDS="+strconv.Itoa(sp.shards), pre+"_EXCHANGE="+sp.exchange)
		if sp.maxRate > 0 {
			env = append(env, pre+"_MAX_RATE="+strconv.Itoa(sp.maxRate))
		}
	}
	if g := sp.ingress; g != nil {
		pre := config.QueuePrefix(queues[0])
		env = append(env, pre+"_INGRESS_EXCHANGE="+g.exchange, pre+"_INGRESS_QUEUE_TYPE="+g.queueType,
			pre+"_INGRESS_PREFETCH="+strconv.Itoa(g.prefetch))
	}
	if sp.stamp {
		env = append(env, stampVar+"=true")
	}
	return env, nil
}

// withClientName names the instance's Redis connections, so that the
// bench can tell them from clients it does not know.
func withClientName(raw, name string) (string, error) { return withQuery(raw, "client_name", name) }

// withQuery sets the URL's query parameters named in kv (name, value,
// ...). Every mode's URL takes them: go-redis reads the query of single,
// cluster and Sentinel URLs alike.
func withQuery(raw string, kv ...string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("redis URL does not parse") // never echo it: it may hold a password
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// startInstance starts dispatcher number n.
func startInstance(sp instanceSpec, n int) (*instance, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	env, err := sp.env(n, addr)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(sp.binary)
	cmd.Env = env
	cmd.SysProcAttr = childAttr()
	in := &instance{cmd: cmd, addr: addr, out: &tailBuffer{max: 16 << 10}, done: make(chan struct{}), lim: sp.limiter}
	cmd.Stdout, cmd.Stderr = in.out, in.out
	if err := startCapped(cmd, sp.limiter, &in.cg); err != nil {
		return nil, fmt.Errorf("start dispatcher %s: %w", sp.binary, err)
	}
	go func() { in.err = cmd.Wait(); close(in.done) }()
	return in, nil
}

// startCapped starts cmd, in a cgroup of its own made with lim unless lim
// is nil; *cg is set to the cgroup, which the caller removes once the
// process has ended.
func startCapped(cmd *exec.Cmd, lim *cpuLimiter, cg **cgroup) error {
	if lim == nil {
		return cmd.Start()
	}
	g, err := lim.make()
	if err != nil {
		return err
	}
	if err := g.start(cmd); err != nil {
		return errors.Join(err, lim.remove(g))
	}
	*cg = g
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// waitReady waits until the instance answers /readyz with 200.
func (in *instance) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := httpClient.Get("http://" + in.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-in.done:
			return fmt.Errorf("dispatcher pid %d exited before it was ready (%v):\n%s", in.cmd.Process.Pid, in.err, in.out.String())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dispatcher pid %d not ready within %s:\n%s", in.cmd.Process.Pid, timeout, in.out.String())
		}
	}
}

// metrics reads the instance's counters of interest from /metrics: the
// sum over label sets of each name asked for.
func (in *instance) metrics(names ...string) (map[string]float64, error) {
	resp, err := httpClient.Get("http://" + in.addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body, names)
}

func parseMetrics(r io.Reader, names []string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, n := range names {
			rest, ok := strings.CutPrefix(line, n)
			if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
				continue
			}
			f := strings.Fields(rest)
			if len(f) == 0 {
				continue
			}
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				out[n] += v
			}
		}
	}
	return out, sc.Err()
}

// procStats reads the instance's CPU seconds (user + system) and peak
// resident memory (VmHWM, bytes) from /proc. Linux only.
func (in *instance) procStats() (cpuSec float64, hwm int64, err error) {
	return procStats(in.cmd.Process.Pid)
}

// procStats reads a process's CPU seconds (user + system) and peak
// resident memory (VmHWM, bytes) from /proc. Linux only.
func procStats(pid int) (cpuSec float64, hwm int64, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read CPU time: %w", err)
	}
	cpuSec, err = parseStatCPU(string(stat))
	if err != nil {
		return 0, 0, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read peak RSS: %w", err)
	}
	hwm, err = parseHWM(string(status))
	return cpuSec, hwm, err
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// parseStatCPU reads utime + stime (fields 14 and 15) of /proc/<pid>/stat;
// the command name (field 2) may hold spaces, so fields count from the
// last ')'.
func parseStatCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')'")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, errors.New("/proc stat: too few fields")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("/proc stat: bad utime/stime")
	}
	return float64(u+s) / clockTicks, nil
}

func parseHWM(status string) (int64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10, nil
				}
			}
		}
	}
	return 0, errors.New("/proc status: no VmHWM")
}

// stop sends SIGTERM and waits for a clean exit, killing the process if it
// takes longer than timeout, then removes its cgroup. It returns an error
// unless the exit was clean.
func (in *instance) stop(timeout time.Duration) error {
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-in.done:
	case <-time.After(timeout):
		_ = in.cmd.Process.Kill()
		<-in.done
		err = fmt.Errorf("dispatcher pid %d did not stop within %s; killed:\n%s", in.cmd.Process.Pid, timeout, in.out.String())
	}
	if err == nil && in.err != nil {
		err = fmt.Errorf("dispatcher pid %d: %v:\n%s", in.cmd.Process.Pid, in.err, in.out.String())
	}
	if in.cg != nil {
		err = errors.Join(err, in.lim.remove(in.cg))
		in.cg = nil
	}
	return err
}

// fleet is the instances of one point.
type fleet []*instance

func startFleet(ctx context.Context, sp instanceSpec, k int) (fleet, error) {
	var f fleet
	for n := range k {
		in, err := startInstance(sp, n)
		if err != nil {
			f.stop()
			return nil, err
		}
		f = append(f, in)
	}
	return f, ctx.Err()
}

func (f fleet) waitReady(ctx context.Context) error {
	for _, in := range f {
		if err := in.waitReady(ctx, 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// exited returns an instance that has exited, or nil.
func (f fleet) exited() *instance {
	for _, in := range f {
		select {
		case <-in.done:
			return in
		default:
		}
	}
	return nil
}

// sum adds a metric over the fleet.
func (f fleet) sum(name string) (float64, error) {
	var total float64
	for _, in := range f {
		m, err := in.metrics(name)
		if err != nil {
			return 0, err
		}
		total += m[name]
	}
	return total, nil
}

// each reads the named counters of every instance, each summed over its
// label sets; a name an instance does not export is absent from its map.
func (f fleet) each(names ...string) ([]map[string]float64, error) {
	out := make([]map[string]float64, len(f))
	for i, in := range f {
		m, err := in.metrics(names...)
		if err != nil {
			return nil, err
		}
		out[i] = m
	}
	return out, nil
}

// throttles reads each instance's cgroup cpu.stat (nil without a cap).
func (f fleet) throttles() ([]Throttle, error) {
	if len(f) == 0 || f[0].cg == nil {
		return nil, nil
	}
	out := make([]Throttle, len(f))
	for i, in := range f {
		t, err := in.cg.throttle()
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

// usage is CPU seconds of all and the largest peak RSS of any instance.
func (f fleet) usage() (cpu []float64, hwm []int64, err error) {
	for _, in := range f {
		c, h, err := in.procStats()
		if err != nil {
			return nil, nil, err
		}
		cpu, hwm = append(cpu, c), append(hwm, h)
	}
	return cpu, hwm, nil
}

// stop stops every instance at once and joins their errors.
func (f fleet) stop() error {
	errs := make([]error, len(f))
	var wg sync.WaitGroup
	for i, in := range f {
		wg.Go(func() { errs[i] = in.stop(30 * time.Second) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
