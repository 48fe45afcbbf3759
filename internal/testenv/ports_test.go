package testenv

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// portThief takes ports of private servers between their draw and the
// server's bind, as a client's ephemeral port took a private RabbitMQ
// node's AMQP port in CI (listen_error eaddrinuse), or as another test
// process's server might. Everything it holds is released when the test
// ends.
type portThief struct {
	t     *testing.T
	mu    sync.Mutex
	taken []int
	close []io.Closer
}

// stealPorts calls take with each draw of ports (n counts draws from 1)
// until the test ends.
func stealPorts(t *testing.T, take func(th *portThief, n int, ports []int)) *portThief {
	th := &portThief{t: t}
	draws := 0
	portsChosen = func(ports []int) {
		th.mu.Lock()
		draws++
		n := draws
		th.mu.Unlock()
		take(th, n, ports)
	}
	t.Cleanup(func() {
		portsChosen = nil
		th.mu.Lock()
		defer th.mu.Unlock()
		for _, c := range th.close {
			c.Close()
		}
	})
	return th
}

// hold binds port with an outgoing connection, as the kernel's choice of
// a client's port would, to a listener of its own.
func (th *portThief) hold(port int) {
	far, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		th.t.Errorf("hold port %d: %v", port, err)
		return
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}}
	c, err := d.Dial("tcp", far.Addr().String())
	if err != nil {
		far.Close()
		th.t.Errorf("hold port %d: %v", port, err)
		return
	}
	th.took(port, far, c)
}

// relay listens on port and relays each connection to the server at
// upstream, as if another server had bound port first.
func (th *portThief) relay(port int, upstream string) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		th.t.Errorf("relay port %d: %v", port, err)
		return
	}
	th.took(port, l)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			th.took(0, c, u)
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

// took records port (0: none) and what holds it.
func (th *portThief) took(port int, holders ...io.Closer) {
	th.mu.Lock()
	defer th.mu.Unlock()
	if port != 0 {
		th.taken = append(th.taken, port)
	}
	th.close = append(th.close, holders...)
}

// ports are the ports taken so far.
func (th *portThief) ports() []int {
	th.mu.Lock()
	defer th.mu.Unlock()
	return slices.Clone(th.taken)
}

// TestRedisStartsAfterPortTaken: the first port drawn is held by a
// client's connection, the second answers as another Redis (the shared
// one, relayed) before redis-server binds it; the server starts on the
// third, and is itself what answers there.
func TestRedisStartsAfterPortTaken(t *testing.T) {
	other := HostPort(RedisURL(t))
	th := stealPorts(t, func(th *portThief, n int, ports []int) {
		switch n {
		case 1:
			th.hold(ports[0])
		case 2:
			th.relay(ports[0], other)
		}
	})
	s := StartRedis(t, RedisOptions{})
	if got := th.ports(); len(got) != 2 || slices.Contains(got, s.Port) {
		t.Fatalf("taken %v, server on %d: want two ports taken, the server on another", got, s.Port)
	}
	info, err := s.Client().Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if pid := redisInfoField(info, "process_id"); pid != strconv.Itoa(s.PID()) {
		t.Fatalf("the server's port answers as pid %s, want %d", pid, s.PID())
	}
}

// TestRedisClusterStartsAfterBusPortTaken: a node's cluster bus port is
// taken before it binds it; the cluster still starts.
func TestRedisClusterStartsAfterBusPortTaken(t *testing.T) {
	th := stealPorts(t, func(th *portThief, n int, ports []int) {
		if n == 1 {
			th.hold(ports[len(ports)-1]) // the bus port
		}
	})
	c := StartRedisCluster(t, ClusterOptions{ReplicasPer: -1})
	if got := th.ports(); len(got) != 1 {
		t.Fatalf("taken %v: want one port", got)
	}
	if err := c.Client().Set(context.Background(), Name(t), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestClusterEnabledByArgsDrawsBusPort: a lone cluster-enabled server
// started through Args (as a test of CLUSTER KEYSLOT does) gets a drawn
// bus port too. Redis's default, the port + 10000, is refused when the
// drawn port is above 55535, which failed such a test in CI.
func TestClusterEnabledByArgsDrawsBusPort(t *testing.T) {
	s := StartRedis(t, RedisOptions{Args: []string{
		"cluster-enabled yes",
		"cluster-config-file " + filepath.Join(t.TempDir(), "nodes.conf"),
	}})
	got, err := s.Client().ConfigGet(context.Background(), "cluster-port").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got["cluster-port"] == "0" || got["cluster-port"] != strconv.Itoa(s.busPort) {
		t.Fatalf("cluster-port %q, drawn bus port %d: want the drawn one", got["cluster-port"], s.busPort)
	}
}

// TestRabbitNodeStartsAfterPortsTaken: before the node binds them, the
// AMQP port of the first draw is held by a client's connection, the
// Erlang distribution port of the second too, and the AMQP port of the
// third answers as another broker (the shared one, relayed); the node
// starts on the fourth.
func TestRabbitNodeStartsAfterPortsTaken(t *testing.T) {
	other := HostPort(AMQPURL(t))
	th := stealPorts(t, func(th *portThief, n int, ports []int) {
		switch n {
		case 1:
			th.hold(ports[0]) // AMQP
		case 2:
			th.hold(ports[2]) // distribution
		case 3:
			th.relay(ports[0], other)
		}
	})
	n := NewRabbitNode(t)
	if got := th.ports(); len(got) != 3 || slices.Contains(got, n.Port) {
		t.Fatalf("taken %v, node on %d: want three ports taken, the node on others", got, n.Port)
	}
	if err := n.ownsPort(); err != nil {
		t.Fatal(err)
	}
}

// No drawn port is one a headless browser refuses to load a page from
// (TestStatusPageFreshnessAxesThroughput failed in CI with
// net::ERR_UNSAFE_PORT on a status page served on such a port). 5,000
// draws hit one of them nearly every time without the filter.
func TestFreePortsNoBrowserRestricted(t *testing.T) {
	for _, p := range []int{6000, 6666, 10080} {
		if !browserRestricted(p) {
			t.Fatalf("port %d not known as restricted", p)
		}
	}
	ports, err := freePorts(5000)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if browserRestricted(p) {
			t.Fatalf("drew port %d, which Chromium refuses (ERR_UNSAFE_PORT)", p)
		}
	}
}
