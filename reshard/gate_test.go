package reshard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// gate is a go-redis hook that holds a client's commands until a test lets
// each run, and can hold a reply back: the test drives a producer running
// on a goroutine of its own one command at a time, interleaved with its own
// calls, and can make one of its writes slow (its reply late).
type gate struct {
	ask     chan []redis.Cmder // a command (or a pipeline) waits to run
	grant   chan struct{}
	ran     chan []redis.Cmder // it ran
	release chan time.Time     // when its reply may return
	open    atomic.Bool        // every command runs at once, unheld
	quit    chan struct{}
	pending []redis.Cmder // asked, not yet let through (poll)
}

var errGateClosed = errors.New("gate closed: the test ended")

func newGate() *gate {
	return &gate{ask: make(chan []redis.Cmder), grant: make(chan struct{}), ran: make(chan []redis.Cmder),
		release: make(chan time.Time), quit: make(chan struct{})}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return g.pass([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return g.pass(cmds, func() error { return next(ctx, cmds) })
	}
}

// pass runs on the client's goroutine: it waits for the test to let the
// commands run, runs them, tells the test, and returns their reply when
// the test says.
func (g *gate) pass(cmds []redis.Cmder, run func() error) error {
	if g.open.Load() || handshake(cmds) {
		return run()
	}
	select {
	case g.ask <- cmds:
	case <-g.quit:
		return errGateClosed
	}
	select {
	case <-g.grant:
	case <-g.quit:
		return errGateClosed
	}
	err := run()
	select {
	case g.ran <- cmds:
	case <-g.quit:
		return err
	}
	var until time.Time
	select {
	case until = <-g.release:
	case <-g.quit:
		return err
	}
	select {
	case <-time.After(time.Until(until)):
	case <-g.quit:
	}
	return err
}

// handshake reports whether cmds set up a new connection (go-redis runs
// them through the hooks too): they pass.
func handshake(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		switch c.Name() {
		case "hello", "client", "auth", "select", "ping", "readonly":
		default:
			return false
		}
	}
	return true
}

// poll reports whether a command waits to run (taking it: the next run
// lets it through).
func (g *gate) poll() bool {
	if g.pending != nil {
		return true
	}
	select {
	case g.pending = <-g.ask:
		return true
	default:
		return false
	}
}

// run lets the next command (or pipeline) run, waiting up to wait for it
// to ask and to run, and returns it; reply must follow.
func (g *gate) run(wait time.Duration) ([]redis.Cmder, error) {
	timeout := time.After(wait)
	if g.pending == nil {
		select {
		case g.pending = <-g.ask:
		case <-timeout:
			return nil, fmt.Errorf("no command asked to run within %v", wait)
		}
	}
	g.pending = nil
	select {
	case g.grant <- struct{}{}:
	case <-timeout:
		return nil, fmt.Errorf("the command asked, but did not take the grant within %v", wait)
	}
	select {
	case cmds := <-g.ran:
		return cmds, nil
	case <-timeout:
		return nil, fmt.Errorf("the command did not run within %v", wait)
	}
}

// reply lets the reply of the command that ran last return at until (at
// once if it is past).
func (g *gate) reply(until time.Time) {
	select {
	case g.release <- until:
	case <-g.quit:
	}
}

// close lets everything waiting at the gate go, with errGateClosed.
func (g *gate) close() {
	select {
	case <-g.quit:
	default:
		close(g.quit)
	}
}
