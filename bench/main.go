// Package bench is `dispatcher bench`: it measures the dispatcher against
// the raw broker on the user's own Redis and RabbitMQ. It starts the
// dispatchers as child processes of the same binary, schedules tasks
// through Redis as producers do, and consumes them with a plain AMQP
// consumer; see Main's usage text for what it reports.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
)

// Exit codes, as the daemon's.
const (
	exitOK       = 0
	exitFailure  = 1
	exitSettings = 2
)

// Main runs `dispatcher bench` with args (after "bench") and returns the
// exit code: tables on stdout, progress on stderr.
func Main(args []string, stdout, stderr io.Writer) int {
	// go-redis would log every failed dial before the error it returns,
	// which the bench reports.
	redis.SetLogger(redisconn.Quiet{})
	if len(args) > 0 && args[0] == probeFlag {
		return probeMain(args[1:], os.Stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == floorFlag {
		return floorMain(args[1:], os.Stdin, stdout, stderr)
	}
	opt, err := parseOptions(args, stderr)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
		return exitSettings
	}
	if opt.Dispatcher == "" {
		if opt.Dispatcher, err = os.Executable(); err != nil {
			fmt.Fprintf(stderr, "dispatcher bench: find this executable: %v (give -dispatcher)\n", err)
			return exitSettings
		}
	}
	points := plan(opt)

	// Ctrl-C stops the run; what is finished is still reported, and every
	// key, queue and exchange made is removed. A second Ctrl-C kills.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()

	if opt.Compare != "" {
		return runComparison(ctx, opt, args, points, stdout, stderr)
	}
	rep := &Report{Version: 1, Command: commandLine(args), Started: time.Now(), Options: opt,
		Ceilings: []*Ceiling{}, Results: []*Result{}, Idle: []*IdleResult{}, Failures: []string{}}
	r, err := newRunner(ctx, opt, stderr, rep)
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
		return exitFailure
	}
	defer r.close()
	fmt.Fprintf(stderr, "dispatcher bench %s: %d points; %s\nconsumer: %s\n", r.runID, len(points), rep.Machine, rep.Consumer)
	if rep.CPUCap != nil {
		fmt.Fprintf(stderr, "CPU cap: %s\n", rep.CPUCap)
	}
	if !r.stamps {
		r.warnf("%s does not list %s in its --help: started without it, no dispatch view of lateness", opt.Dispatcher, stampVar)
	}

	runErr := r.run(ctx, points)
	rep.Finished = time.Now()
	if runErr != nil {
		rep.Failures = append(rep.Failures, runErr.Error())
	}
	writeTables(stdout, rep)
	code := exitOK
	if len(rep.Failures) > 0 {
		code = exitFailure
	}
	if err := writeReports(opt, rep, ctx.Err() != nil); err != nil {
		fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
		code = exitFailure
	}
	return code
}

// writeReports writes the -json and -svg files of a run that ran to its
// end, its failures included; an interrupted run (Ctrl-C, SIGTERM) leaves
// them as they were, since they may be a tracked report its stub would
// replace. The tables on stdout show what it measured.
func writeReports(opt *Options, rep *Report, interrupted bool) error {
	var paths []string
	for _, p := range []string{opt.JSONPath, opt.SVGPath} {
		if p != "" {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	if interrupted {
		return fmt.Errorf("interrupted: %s not written, left as they were", strings.Join(paths, " and "))
	}
	var errs []error
	if opt.JSONPath != "" {
		errs = append(errs, writeJSON(opt.JSONPath, rep))
	}
	if opt.SVGPath != "" {
		errs = append(errs, writeSVG(opt.SVGPath, rep))
	}
	return errors.Join(errs...)
}

// run measures the points in order; it stops at the first error (an
// interrupt, a server that went away), keeping what was measured.
func (r *runner) run(ctx context.Context, points []Point) error {
	for i, p := range points {
		r.prog.printf("[%d/%d] %s\n", i+1, len(points), p)
		began := time.Now()
		var err error
		switch p.Mode {
		case modeScale:
			var res *ScaleResult
			res, err = r.runScale(ctx, p)
			if res != nil && (err == nil || len(res.Steps) > 0) {
				r.rep.Scale = append(r.rep.Scale, res)
				r.rep.Failures = append(r.rep.Failures, res.Errors...)
			}
			if err == nil {
				r.prog.printf("%s [%.0fs]\n", scaleText(res), time.Since(began).Seconds())
			}
		case modeMemory:
			var res *MemoryResult
			res, err = r.runMemory(ctx, p)
			if res != nil && err == nil {
				r.rep.Memory = append(r.rep.Memory, res)
				r.prog.printf("%s [%.0fs]\n", memoryText(res), time.Since(began).Seconds())
			}
		case modeIdle:
			var res *IdleResult
			res, err = r.runIdle(ctx, p)
			if res != nil && err == nil {
				r.rep.Idle = append(r.rep.Idle, res)
				r.rep.Failures = append(r.rep.Failures, res.failures()...)
				r.prog.printf("  => %.0f Redis commands/s (%.0f per instance), %.0f script calls/s, Redis CPU %s%%, CPU %.2f%% per instance [%.0fs]\n",
					res.CmdsPerSec, res.CmdsPerSecPerInstance, res.ScriptsPerSec, fmtPct(res.RedisCPUPercent), res.CPUPercent,
					time.Since(began).Seconds())
			}
		default:
			var res *Result
			switch p.Mode {
			case modeBacklog:
				res, err = r.runBacklog(ctx, p)
			case modeBurst:
				res, err = r.runBurst(ctx, p)
			case modeIngress:
				res, err = r.runIngress(ctx, p)
			default:
				res, err = r.runRate(ctx, p)
			}
			if res != nil && err == nil {
				r.rep.Results = append(r.rep.Results, res)
				r.rep.Failures = append(r.rep.Failures, res.failures()...)
				r.prog.printf("  => %s tasks/s%s, lateness p50/p99/max dispatch %s ms, consumer %s ms%s, %.2f Redis cmds/task, %.2f CPU s/10k, Redis CPU %s s/10k, %.0f MB, %d dups, %d missing [%.0fs]\n",
					thousands(int(res.PerSec)), ratioText(res), latShort(res.DispatchLateness), latShort(&res.Lateness),
					firstSecondText(res), res.CmdsPerTask, res.CPUPer10k, fmtOpt(res.RedisCPUPer10k, "%.2f"), res.PeakRSSMB,
					res.Duplicates, res.Missing, time.Since(began).Seconds())
				if res.Burst != nil {
					r.prog.printf("%s\n", burstText(res.Burst))
				}
				if res.Ingress != nil {
					r.prog.printf("%s\n", ingressText(res))
				}
				if res.Floor != nil {
					r.prog.printf("  => %s\n", floorText(res.Floor))
				}
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted during %s", p)
			}
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func firstSecondText(res *Result) string {
	f := res.FirstSecond
	if f == nil {
		return ""
	}
	return fmt.Sprintf(" (first 1 s: dispatch %s, consumer %s ms)", latShort(f.DispatchLateness), latShort(&f.Lateness))
}

func ratioText(res *Result) string {
	if res.Ratio == 0 || res.Ingress != nil { // an ingress point's is its ingest's
		return ""
	}
	return fmt.Sprintf(" (%.2f of the ceiling)", res.Ratio)
}

// commandLine is the run's command as a user would type it again.
func commandLine(args []string) string {
	parts := []string{"dispatcher", "bench"}
	for _, a := range args {
		// Hide a URL's password, whether given as -redis=URL or -redis URL.
		if k, v, ok := strings.Cut(a, "="); ok && strings.Contains(v, "://") {
			a = k + "=" + redact.URLs(v)
		} else if strings.Contains(a, "://") {
			a = redact.URLs(a)
		}
		if strings.ContainsAny(a, " '\"$`\\*?") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}
