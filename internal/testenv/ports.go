package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// Ports of private servers. A port found free and released may be taken
// before the server binds it: by an outgoing connection, whose ephemeral
// port the kernel draws from ip_local_port_range, or by another test
// process. So ports are drawn at random outside that range (which ends the
// first race and makes the second rare, and keeps a crashed server's port
// free for its restart), and every first start of a private server goes
// through startOnPorts, which starts it again on new ports when it could
// not bind one.

// errPortTaken marks a start that failed because a port was taken between
// its draw and the server's bind.
var errPortTaken = errors.New("a port was taken before the server bound it")

// portsChosen, when set by a test, sees each draw of ports before a server
// starts on them.
var portsChosen func(ports []int)

// startAttempts bounds the draws of startOnPorts: a race lost that often
// is no race.
const startAttempts = 5

// startOnPorts draws n free ports and calls start with them; when start
// fails with errPortTaken (it has stopped the server and cleaned up what
// the attempt left), it draws new ones and starts again. logf says why.
func startOnPorts(n int, logf func(string, ...any), start func(ports []int) error) error {
	var err error
	for range startAttempts {
		var ports []int
		if ports, err = freePorts(n); err != nil {
			return err
		}
		if portsChosen != nil {
			portsChosen(ports)
		}
		if err = start(ports); !errors.Is(err, errPortTaken) {
			return err
		}
		// The first line: the logs follow on the next ones.
		msg, _, _ := strings.Cut(err.Error(), "\n")
		logf("ports %v: %s; starting again on new ones", ports, msg)
	}
	return fmt.Errorf("%d draws of ports: %w", startAttempts, err)
}

// bindFailed tells from a server's log whether it exited because a port
// was in use: redis-server says "Address already in use", RabbitMQ
// "eaddrinuse" for a listener and "dist_port_already_used" for the Erlang
// distribution port, which it checks before it starts.
func bindFailed(log string) bool {
	for _, s := range []string{"Address already in use", "eaddrinuse", "dist_port_already_used"} {
		if strings.Contains(log, s) {
			return true
		}
	}
	return false
}

// freePorts returns n distinct ports on 127.0.0.1 that no socket holds
// now, drawn at random outside the ephemeral range when there is room
// outside it (the kernel's choice, from the range, otherwise).
func freePorts(n int) ([]int, error) {
	lo, hi := ephemeralRange()
	below := max(0, lo-1024)             // 1024..lo-1
	above := max(0, 65535-max(hi, 1023)) // hi+1..65535
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries == 10_000 {
			return nil, fmt.Errorf("no %d free ports on 127.0.0.1 outside %d-%d after %d tries", n, lo, hi, tries)
		}
		port := 0
		if below+above >= 1000 {
			if r := rand.IntN(below + above); r < below {
				port = 1024 + r
			} else {
				port = max(hi, 1023) + 1 + r - below
			}
		}
		got, err := tryBind(port)
		if err != nil {
			if port == 0 {
				return nil, err
			}
			continue
		}
		if browserRestricted(got) {
			continue // a test's headless browser would refuse it (ERR_UNSAFE_PORT)
		}
		if !slices.Contains(ports, got) {
			ports = append(ports, got)
		}
	}
	return ports, nil
}

// tryBind binds 127.0.0.1:port (0: any) without SO_REUSEADDR, so that a
// port held by any socket, one in TIME_WAIT too, counts as taken, and
// releases it. It returns the port bound.
func tryBind(port int) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return 0, fmt.Errorf("bind 127.0.0.1:%d: %w", port, err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return 0, fmt.Errorf("getsockname: %w", err)
	}
	return sa.(*syscall.SockaddrInet4).Port, nil
}

// ephemeralRange is the kernel's range for outgoing connections' ports;
// Linux's default if it cannot be read.
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	var l, h int
	if _, err := fmt.Sscan(string(b), &l, &h); err == nil && l >= 1 && l <= h && h <= 65535 {
		lo, hi = l, h
	}
	return lo, hi
}

// FreeAddr returns a 127.0.0.1 TCP address no socket holds now, outside
// the ephemeral range (see freePorts). Something else may still take it
// before the caller binds it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(ports[0]))
}

// browserRestrictedPorts are the ports above 1023 that Chromium refuses to
// load a page from (net::ERR_UNSAFE_PORT; kRestrictedPorts in its
// net/base/port_util.cc): a status page served on one cannot be tested.
var browserRestrictedPorts = []int{1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566,
	6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080}

func browserRestricted(port int) bool { return slices.Contains(browserRestrictedPorts, port) }
