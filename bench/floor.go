package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/shard"
)

// Floor is the AMQP client library's own cost at the cadence the
// dispatcher published: amqp091-go alone, in a process of its own,
// publishing as many calls a second, each of as many messages, as the
// instances did, confirmed, persistent and mandatory, of the same size,
// to the point's exchange (or one like it) and consumer. Its CPU per
// 10,000 messages is what publishing alone costs; the instances' CPU per
// 10,000 tasks is given as a multiple of it.
type Floor struct {
	Name string `json:"name"` // exchange and consumer queue
	// The cadence asked for: the instances' publish calls and tasks per
	// second over the point's traffic (its -duration); CallsFrom names
	// the metric the calls were read from.
	CallsPerSec float64 `json:"calls_per_sec"`
	MsgsPerSec  float64 `json:"messages_per_sec"`
	CallsFrom   string  `json:"calls_from"`
	Size        int     `json:"size"`
	Pipeline    int     `json:"pipeline"` // calls outstanding at most
	// What it did: from its first publish to its last confirm.
	Seconds   float64 `json:"seconds"`
	Calls     int64   `json:"calls"`
	Messages  int64   `json:"messages"`
	Confirmed int64   `json:"confirmed"`
	Nacked    int64   `json:"nacked"`
	Returned  int64   `json:"returned"`
	// At the consumer: received, missing, duplicates, and receipt minus
	// publish time.
	Received   int   `json:"received"`
	Missing    int   `json:"missing"`
	Duplicates int64 `json:"duplicates"`
	Latency    Dist  `json:"latency"`
	// CPUSeconds is its utime+stime (/proc, as the instances') from its
	// first publish to its last confirm; CPUPer10k per 10,000 messages;
	// LifeCPUSeconds its whole life's (rusage at exit: the dial too).
	CPUSeconds     float64   `json:"cpu_seconds"`
	CPUPer10k      float64   `json:"cpu_seconds_per_10k"`
	LifeCPUSeconds float64   `json:"life_cpu_seconds"`
	Throttle       *Throttle `json:"throttle,omitempty"` // with -cpu-cap
	// DispatcherCPUPer10k is the instances' CPU per 10,000 tasks at the
	// point; Ratio that over the floor's.
	DispatcherCPUPer10k float64  `json:"dispatcher_cpu_seconds_per_10k"`
	Ratio               float64  `json:"ratio"`
	Errors              []string `json:"errors,omitempty"`
}

// cadence is what the floor publishes at.
type cadence struct {
	callsPerSec, msgsPerSec float64
	callsFrom               string
}

// Metrics the cadence is read from: the publisher's calls, or where a
// dispatcher does not export them (an older one), its claims.
const (
	metricDispatched = "dispatcher_tasks_dispatched_total"
	metricCalls      = "dispatcher_broker_publish_batches_total"
	metricClaims     = "dispatcher_claim_batch_size_count"
)

// floorFlag, as `dispatcher bench`'s first argument, runs the floor's
// publisher instead of a bench (floorMain); floorURLVar hands it the
// broker URL, out of the process list.
const (
	floorFlag   = "-floor-publisher"
	floorURLVar = "BENCH_FLOOR_AMQP_URL"
)

// floorPipeline is how many publish calls the floor keeps outstanding at
// most: DISPATCHER_PIPELINE's, as the instances got it.
func floorPipeline() int {
	if n, err := strconv.Atoi(os.Getenv("DISPATCHER_PIPELINE")); err == nil && n >= 1 && n <= 64 {
		return n
	}
	return 4 // the dispatcher's default
}

// measureFloor runs the floor's publisher at c for d, to the sink's
// exchange with keys as routing keys in turn; the sink's deliveries go to
// a recorder of the floor's own from now on, and the sink is stopped at
// the end.
func (r *runner) measureFloor(ctx context.Context, sk *sink, keys []string, size int, c cadence, d time.Duration) (*Floor, error) {
	f := &Floor{Name: sk.exchange, CallsPerSec: c.callsPerSec, MsgsPerSec: c.msgsPerSec, CallsFrom: c.callsFrom, Size: size, Pipeline: floorPipeline()}
	calls, msgs := floorCounts(c, d)
	if calls == 0 || msgs == 0 {
		return nil, fmt.Errorf("floor: no cadence to publish at (%.1f calls/s, %.1f messages/s)", c.callsPerSec, c.msgsPerSec)
	}
	rec := newRecorder(msgs, 1, r.earlyUs)
	sk.use(rec)
	defer sk.stop()

	args := []string{"bench", floorFlag, "-exchange", sk.exchange, "-keys", strings.Join(keys, ","), "-size", strconv.Itoa(size),
		"-calls", strconv.Itoa(calls), "-messages", strconv.Itoa(msgs), "-duration", d.String(), "-pipeline", strconv.Itoa(f.Pipeline)}
	cmd := exec.Command(r.opt.Dispatcher, args...)
	cmd.Env = append(os.Environ(), floorURLVar+"="+r.opt.firstAMQP())
	cmd.SysProcAttr = childAttr()
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var cg *cgroup
	if err := startCapped(cmd, r.limiter, &cg); err != nil {
		return nil, fmt.Errorf("floor: start %s: %w", r.opt.Dispatcher, err)
	}
	exited := false
	defer func() {
		stdin.Close()
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if cg != nil {
			if err := r.limiter.remove(cg); err != nil {
				r.warnf("floor: %v", err)
			}
		}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	childErr := func(what string) error {
		return fmt.Errorf("floor: %s: %s", what, strings.TrimSpace(errOut.String()))
	}
	if line, err := readLine(ctx, lines, 30*time.Second); err != nil || line != "ready" {
		return nil, childErr(fmt.Sprintf("no ready from the publisher (%q, %v)", line, err))
	}
	pid := cmd.Process.Pid
	cpu0, _, err := procStats(pid)
	if err != nil {
		return nil, err
	}
	var thr0 Throttle
	if cg != nil {
		if thr0, err = cg.throttle(); err != nil {
			return nil, err
		}
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return nil, childErr("start the publisher")
	}
	stopProg := r.prog.start(func() string {
		return fmt.Sprintf("floor: %s calls/s of %.1f messages, %s/%s received", thousands(int(c.callsPerSec+0.5)),
			c.msgsPerSec/c.callsPerSec, thousands(int(rec.unique.Load())), thousands(msgs))
	})
	defer stopProg()
	line, err := readLine(ctx, lines, d+time.Minute)
	if err != nil {
		return nil, childErr(fmt.Sprintf("the publisher did not finish (%v)", err))
	}
	cpu1, _, err := procStats(pid)
	if err != nil {
		return nil, err
	}
	if cg != nil {
		thr1, err := cg.throttle()
		if err != nil {
			return nil, err
		}
		t := thr1.minus(thr0)
		f.Throttle = &t
	}
	if err := parseFloorDone(line, f); err != nil {
		return nil, childErr(err.Error())
	}
	stdin.Close()
	exited = true
	if err := cmd.Wait(); err != nil {
		return nil, childErr(fmt.Sprintf("publisher: %v", err))
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		f.LifeCPUSeconds = tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
	}
	f.CPUSeconds = cpu1 - cpu0
	if f.Messages > 0 {
		f.CPUPer10k = f.CPUSeconds * 10000 / float64(f.Messages)
	}
	if err := r.waitFor(ctx, func() bool { return rec.missing() == 0 }, received(rec)); err != nil && ctx.Err() != nil {
		return nil, err
	}
	stopProg()
	sk.stop() // the recorder is read from here on
	f.Received, f.Missing, f.Duplicates = int(rec.unique.Load()), rec.missing(), rec.dups.Load()
	f.Latency = distNoCurve(rec.late)
	if f.Missing > 0 || f.Nacked > 0 || f.Returned > 0 || f.Duplicates > 0 || f.Confirmed != f.Messages {
		f.Errors = append(f.Errors, fmt.Sprintf("floor: %d published, %d confirmed, %d nacked, %d returned; %d missing and %d duplicates at the consumer",
			f.Messages, f.Confirmed, f.Nacked, f.Returned, f.Missing, f.Duplicates))
	}
	return f, nil
}

// compare sets the ratio to the instances' CPU per 10,000 tasks.
func (f *Floor) compare(dispatcherPer10k float64) {
	f.DispatcherCPUPer10k = dispatcherPer10k
	if f.CPUPer10k > 0 {
		f.Ratio = dispatcherPer10k / f.CPUPer10k
	}
}

// floorText is the floor in a line: "floor 0.53 CPU s/10k, dispatcher
// 0.94 → 1.8×".
func floorText(f *Floor) string {
	ratio := "-"
	if f.Ratio > 0 {
		ratio = fmt.Sprintf("%.1f×", f.Ratio)
	}
	return fmt.Sprintf("floor %.2f CPU s/10k, dispatcher %.2f → %s (at %s calls/s of %.1f messages)",
		f.CPUPer10k, f.DispatcherCPUPer10k, ratio, thousands(int(f.CallsPerSec+0.5)), f.MsgsPerSec/max(f.CallsPerSec, 1e-9))
}

func tvSeconds(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }

// floorCounts is how many calls and messages the floor publishes over d
// at c (rounded; at least one message per call).
func floorCounts(c cadence, d time.Duration) (calls, msgs int) {
	calls = int(math.Round(c.callsPerSec * d.Seconds()))
	msgs = int(math.Round(c.msgsPerSec * d.Seconds()))
	if msgs < calls {
		calls = msgs
	}
	return calls, msgs
}

// callSize is how many of msgs call j of calls carries: spread evenly,
// every call one or more, the sizes summing to msgs.
func callSize(j, calls, msgs int) int {
	return (j+1)*msgs/calls - j*msgs/calls
}

func readLine(ctx context.Context, lines <-chan string, timeout time.Duration) (string, error) {
	select {
	case l, ok := <-lines:
		if !ok {
			return "", errors.New("the publisher exited")
		}
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("nothing within %s", timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// parseFloorDone reads the publisher's last line: "done calls=N
// messages=N confirmed=N nacked=N returned=N seconds=S".
func parseFloorDone(line string, f *Floor) error {
	rest, ok := strings.CutPrefix(line, "done ")
	if !ok {
		return fmt.Errorf("bad line from the publisher: %q", line)
	}
	seen := 0
	for _, kv := range strings.Fields(rest) {
		k, v, _ := strings.Cut(kv, "=")
		if k == "seconds" {
			s, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("bad line from the publisher: %q", line)
			}
			f.Seconds = s
			seen++
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("bad line from the publisher: %q", line)
		}
		switch k {
		case "calls":
			f.Calls = n
		case "messages":
			f.Messages = n
		case "confirmed":
			f.Confirmed = n
		case "nacked":
			f.Nacked = n
		case "returned":
			f.Returned = n
		default:
			return fmt.Errorf("bad line from the publisher: %q", line)
		}
		seen++
	}
	if seen != 6 {
		return fmt.Errorf("bad line from the publisher: %q", line)
	}
	return nil
}

// floorMain is the floor's publisher: it connects, says "ready", waits
// for "go" on stdin, publishes -messages messages in -calls calls spread
// evenly over -duration (each call's messages one after the other, then
// its confirms waited for, up to -pipeline calls outstanding), says
// "done ..." when every confirm is in, and exits when stdin closes.
func floorMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dispatcher bench "+floorFlag, flag.ContinueOnError)
	fs.SetOutput(stderr)
	exchange := fs.String("exchange", "", "exchange")
	keysList := fs.String("keys", routingKey, "routing keys, used in turn")
	size := fs.Int("size", 200, "message size")
	calls := fs.Int("calls", 0, "publish calls")
	msgs := fs.Int("messages", 0, "messages")
	d := fs.Duration("duration", time.Second, "how long")
	pipeline := fs.Int("pipeline", 4, "calls outstanding at most")
	if err := fs.Parse(args); err != nil {
		return exitSettings
	}
	if *calls < 1 || *msgs < *calls || *pipeline < 1 || *size < minSize || *d <= 0 {
		fmt.Fprintf(stderr, "floor: bad settings: %d calls, %d messages, pipeline %d, size %d, duration %s\n", *calls, *msgs, *pipeline, *size, *d)
		return exitSettings
	}
	keys := splitList(*keysList)
	conn, err := amqp.DialConfig(os.Getenv(floorURLVar), amqp.Config{
		Properties: amqp.Table{"connection_name": "dispatcher bench floor"},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		fmt.Fprintf(stderr, "floor: dial broker: %v\n", redact.Error(err))
		return exitFailure
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		fmt.Fprintf(stderr, "floor: confirm-mode channel: %v\n", err)
		return exitFailure
	}
	var returned atomic.Int64
	returns := ch.NotifyReturn(make(chan amqp.Return, 1024))
	go func() {
		for range returns {
			returned.Add(1)
		}
	}()
	in := bufio.NewReader(stdin)
	fmt.Fprintln(stdout, "ready")
	if l, err := in.ReadString('\n'); err != nil || strings.TrimSpace(l) != "go" {
		fmt.Fprintf(stderr, "floor: want go on stdin, got %q (%v)\n", l, err)
		return exitFailure
	}

	ctx := context.Background()
	var confirmed, nacked atomic.Int64
	slots := make(chan struct{}, *pipeline)
	var wg sync.WaitGroup
	body := make([]byte, 0, *size)
	begin := time.Now()
	interval := float64(d.Nanoseconds()) / float64(*calls)
	i := 0
	for j := 0; j < *calls; j++ {
		if wait := time.Until(begin.Add(time.Duration(float64(j) * interval))); wait > 0 {
			time.Sleep(wait)
		}
		slots <- struct{}{}
		n := callSize(j, *calls, *msgs)
		dcs := make([]*amqp.DeferredConfirmation, 0, n)
		now := time.Now()
		for range n {
			body = member(body, i, *size)
			due := now.UnixMilli()
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, *exchange, keys[i%len(keys)], true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent,
				MessageId:    shard.MessageID(body, due),
				Timestamp:    now,
				// The dispatcher's headers: x-dispatcher-seq carries the
				// delivery tag, as the dispatcher's does.
				Headers: amqp.Table{"x-due-ms": due, "x-published-us": now.UnixMicro(), "x-dispatcher-seq": int64(ch.GetNextPublishSeqNo())},
				Body:    body,
			})
			if err != nil {
				fmt.Fprintf(stderr, "floor: publish: %v\n", err)
				return exitFailure
			}
			dcs = append(dcs, dc)
			i++
		}
		wg.Go(func() {
			defer func() { <-slots }()
			for _, dc := range dcs {
				if ok, err := dc.WaitContext(ctx); err != nil || !ok {
					nacked.Add(1)
				} else {
					confirmed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(begin)
	// A return comes before its message's ack: it is counted by now, or
	// within a moment.
	time.Sleep(50 * time.Millisecond)
	fmt.Fprintf(stdout, "done calls=%d messages=%d confirmed=%d nacked=%d returned=%d seconds=%.6f\n",
		*calls, i, confirmed.Load(), nacked.Load(), returned.Load(), took.Seconds())
	_, _ = io.Copy(io.Discard, in) // until the bench has read the CPU time and closes stdin
	return exitOK
}
