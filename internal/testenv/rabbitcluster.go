package testenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitCluster is three private nodes joined in one cluster, with
// cluster_partition_handling = pause_minority.
type RabbitCluster struct {
	Nodes []*RabbitNode

	mu       sync.Mutex
	isolated map[*RabbitNode]bool // by Isolate, cleared by Heal and restore
}

// clusterConf is added to each node's rabbitmq.conf: a node that loses
// sight of the majority pauses, as production clusters are configured.
const clusterConf = "cluster_partition_handling = pause_minority\n"

// bogusCookie is what an isolated node presents to, and expects from, the
// other nodes of the cluster; see Isolate.
const bogusCookie = "dispatcher_isolated"

var (
	sharedClusterOnce sync.Once
	sharedCluster     *RabbitCluster
	sharedClusterErr  error
	clusterLock       *os.File // held while this test binary's cluster runs
)

// lockCluster waits until no other test binary on the machine runs a
// cluster: `go test ./...` runs packages in parallel, and two clusters of
// three nodes on two cores would starve each other and every test beside
// them. The kernel drops the lock if the binary dies.
func lockCluster(t testing.TB) error {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "dispatcher-rabbit-cluster.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return fmt.Errorf("cluster lock: %w", err)
	}
	began := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return fmt.Errorf("cluster lock: %w", err)
	}
	if waited := time.Since(began); waited > time.Second {
		t.Logf("waited %s for another test binary's RabbitMQ cluster to stop", waited.Round(time.Second))
	}
	clusterLock = f
	return nil
}

// SharedRabbitCluster returns the cluster shared by the tests of this test
// binary, starting it on first use. Tests run one after another on it; when
// the test ends, its cleanup puts the cluster back: every node running and
// joined, no partition, no alarm. Call StopSharedRabbitCluster from TestMain
// after m.Run; if the test binary dies first, the kernel kills the nodes
// (parent-death signal).
func SharedRabbitCluster(t testing.TB) *RabbitCluster {
	t.Helper()
	sharedClusterOnce.Do(func() {
		if sharedClusterErr = lockCluster(t); sharedClusterErr == nil {
			sharedCluster, sharedClusterErr = startRabbitCluster(t)
		}
	})
	if sharedClusterErr != nil {
		t.Fatalf("private RabbitMQ cluster: %v", sharedClusterErr)
	}
	c := sharedCluster
	t.Cleanup(func() {
		if err := c.restore(); err != nil {
			t.Errorf("restore private RabbitMQ cluster: %v", err)
		}
	})
	return c
}

// StopSharedRabbitCluster stops the cluster SharedRabbitCluster started, if
// any, and removes the nodes' files.
func StopSharedRabbitCluster() {
	if sharedCluster != nil {
		sharedCluster.stop()
	}
	if clusterLock != nil {
		clusterLock.Close() // releases the lock
	}
}

// startRabbitCluster boots three nodes at once, then joins the second and
// third to the first.
func startRabbitCluster(t testing.TB) (*RabbitCluster, error) {
	started := time.Now()
	c := &RabbitCluster{isolated: map[*RabbitNode]bool{}}
	for range 3 {
		n, err := newRabbitNode(t, clusterConf)
		if err != nil {
			for _, n := range c.Nodes {
				n.discard()
			}
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = n.firstBoot(t.Logf) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, n := range c.Nodes {
			if errs[i] == nil {
				n.Stop()
			}
		}
		return nil, err
	}
	booted := time.Since(started)
	first := c.Nodes[0]
	for _, n := range c.Nodes[1:] {
		if err := n.join(first); err != nil {
			c.stop()
			return nil, err
		}
	}
	if err := c.WaitJoined(60 * time.Second); err != nil {
		c.stop()
		return nil, err
	}
	t.Logf("private RabbitMQ cluster up in %s (nodes booted in %s): %s",
		time.Since(started).Round(time.Millisecond), booted.Round(time.Millisecond), strings.Join(c.URLs(), " "))
	return c, nil
}

// join makes n a member of first's cluster, dropping n's own (empty) data.
func (n *RabbitNode) join(first *RabbitNode) error {
	if err := n.StopApp(); err != nil {
		return err
	}
	if _, err := n.Ctl("join_cluster", first.Name); err != nil {
		return err
	}
	if err := n.StartApp(); err != nil {
		return fmt.Errorf("node %s after join_cluster: %w", n.Name, err)
	}
	return nil
}

func (c *RabbitCluster) stop() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Go(n.Stop)
	}
	wg.Wait()
}

// URLs are the nodes' plain AMQP URLs (guest/guest, 127.0.0.1), in node
// order.
func (c *RabbitCluster) URLs() []string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.AMQPURL()
	}
	return urls
}

// NodeAt returns the node whose AMQP listener is addr ("127.0.0.1:port"),
// or nil.
func (c *RabbitCluster) NodeAt(addr string) *RabbitNode {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || (host != "127.0.0.1" && host != "localhost") {
		return nil
	}
	for _, n := range c.Nodes {
		if strconv.Itoa(n.Port) == port {
			return n
		}
	}
	return nil
}

// others are the nodes of c but n.
func (c *RabbitCluster) others(n *RabbitNode) []*RabbitNode {
	var o []*RabbitNode
	for _, m := range c.Nodes {
		if m != n {
			o = append(o, m)
		}
	}
	return o
}

// Isolate cuts node n off from the other two at the Erlang distribution
// level, a network partition as the nodes see it, while rabbitmqctl can
// still talk to every node. The partition is made with cookies: n is told
// that the other nodes' cookie is a bogus one, and its connections to them
// are closed. Each handshake between n and another node then fails in both
// directions (n checks the other's digest against the bogus cookie and
// presents the bogus one itself), whereas the CLI's nodes, which n knows
// under the real cookie, still connect. With pause_minority, n then pauses:
// it stops the RabbitMQ application, which closes client connections and
// its listeners, and pings the others every second until it sees the
// majority again. Isolate returns once the others see n as down and n
// refuses AMQP connections. Isolate one node at a time: with two cut off,
// no node has a majority and all three pause.
func (c *RabbitCluster) Isolate(n *RabbitNode) error {
	c.mu.Lock()
	c.isolated[n] = true
	c.mu.Unlock()
	others := c.others(n)
	if _, err := n.Ctl("eval", fmt.Sprintf(
		"[begin erlang:set_cookie(B, '%s'), erlang:disconnect_node(B) end || B <- [%s]], ok.",
		bogusCookie, atomList(others))); err != nil {
		return fmt.Errorf("isolate %s: %w", n.Name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, o := range others {
		for {
			running, err := c.RunningNodes(o)
			if err == nil && !slices.Contains(running, n.Name) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("isolate %s: %s still sees it running (%v, %v)", n.Name, o.Name, running, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for n.ping() == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("isolate %s: it did not pause, AMQP on port %d still accepts connections", n.Name, n.Port)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// Heal undoes Isolate and waits until n runs again, joined, and accepts
// AMQP, and the cluster shows no partition.
func (c *RabbitCluster) Heal(n *RabbitNode) error {
	if err := c.reconnect(n); err != nil {
		return err
	}
	if err := n.awaitResume(); err != nil {
		return err
	}
	return c.WaitJoined(60 * time.Second)
}

// reconnect gives n the real cookie of the other nodes again and pings
// them; a paused n then sees the majority and starts RabbitMQ by itself.
func (c *RabbitCluster) reconnect(n *RabbitNode) error {
	c.mu.Lock()
	delete(c.isolated, n)
	c.mu.Unlock()
	_, err := n.Ctl("eval", fmt.Sprintf(
		"[begin erlang:set_cookie(B, erlang:get_cookie()), net_adm:ping(B) end || B <- [%s]], ok.",
		atomList(c.others(n))))
	if err != nil {
		return fmt.Errorf("heal %s: %w", n.Name, err)
	}
	return nil
}

// awaitResume waits for a node that was paused to start RabbitMQ again
// once it sees the majority; if it does not within 30 s, it is restarted
// the way an operator would, with stop_app and start_app.
func (n *RabbitNode) awaitResume() error {
	if err := n.waitAMQP(30 * time.Second); err == nil {
		return nil
	}
	if err := n.StopApp(); err != nil {
		return fmt.Errorf("heal %s: %w", n.Name, err)
	}
	if err := n.StartApp(); err != nil {
		return fmt.Errorf("heal %s: %w", n.Name, err)
	}
	return nil
}

func atomList(nodes []*RabbitNode) string {
	atoms := make([]string, len(nodes))
	for i, n := range nodes {
		atoms[i] = "'" + n.Name + "'"
	}
	return strings.Join(atoms, ",")
}

// clusterStatus is the part of `rabbitmqctl cluster_status --formatter
// json` the tests need.
type clusterStatus struct {
	RunningNodes []string        `json:"running_nodes"`
	Partitions   json.RawMessage `json:"partitions"` // {} or [] when none
}

func (n *RabbitNode) clusterStatus() (clusterStatus, error) {
	var st clusterStatus
	out, err := n.Ctl("cluster_status", "--formatter", "json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("cluster_status of %s: %w: %q", n.Name, err, out)
	}
	return st, nil
}

// RunningNodes lists the nodes n sees running in its cluster, n's own
// included if its RabbitMQ application runs (rabbitmqctl cluster_status).
func (c *RabbitCluster) RunningNodes(n *RabbitNode) ([]string, error) {
	st, err := n.clusterStatus()
	return st.RunningNodes, err
}

// WaitJoined waits until rabbitmqctl cluster_status on every node shows
// all nodes running and no partition; it looks at least once.
func (c *RabbitCluster) WaitJoined(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		errs := make([]error, len(c.Nodes))
		var wg sync.WaitGroup
		for i, n := range c.Nodes {
			wg.Go(func() {
				st, err := n.clusterStatus()
				switch p := strings.TrimSpace(string(st.Partitions)); {
				case err != nil:
					errs[i] = err
				case len(st.RunningNodes) != len(c.Nodes):
					errs[i] = fmt.Errorf("%s sees running %v", n.Name, st.RunningNodes)
				case p != "{}" && p != "[]" && p != "" && p != "null":
					errs[i] = fmt.Errorf("%s sees partitions %s", n.Name, p)
				}
			})
		}
		wg.Wait()
		err := errors.Join(errs...)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not joined after %s: %w", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// restore puts the cluster back after a test: isolated nodes reconnected,
// then every node restored as PrivateRabbit's cleanup does (booted after a
// crash, application started, alarms cleared), all at once since a node
// may wait for the others to come back, then all joined.
func (c *RabbitCluster) restore() error {
	c.mu.Lock()
	isolated := c.isolated
	c.isolated = map[*RabbitNode]bool{}
	c.mu.Unlock()
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() {
			select {
			case <-n.current().done: // crashed: it boots with the real cookie
			default:
				if isolated[n] {
					if err := c.reconnect(n); err != nil {
						errs[i] = err
						return
					}
					if err := n.awaitResume(); err != nil {
						errs[i] = err
						return
					}
				}
			}
			if err := n.restore(); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", n.Name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.WaitJoined(60 * time.Second)
}

// DeclareQuorumQueue declares, on the first node that accepts a
// connection, a durable quorum queue bound to exchange (durable direct,
// declared if missing) with key. remove deletes the queue and the exchange.
func (c *RabbitCluster) DeclareQuorumQueue(queue, exchange, key string) (remove func() error, err error) {
	err = c.withChannel(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			return err
		}
		return ch.QueueBind(queue, key, exchange, false, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("declare quorum queue %s: %w", queue, err)
	}
	return func() error {
		err := c.withChannel(func(ch *amqp.Channel) error {
			if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
				return err
			}
			return ch.ExchangeDelete(exchange, false, false)
		})
		if err != nil {
			return fmt.Errorf("delete quorum queue %s: %w", queue, err)
		}
		return nil
	}, nil
}

// withChannel runs f on a channel of the first node that accepts a
// connection.
func (c *RabbitCluster) withChannel(f func(*amqp.Channel) error) error {
	var errs []error
	for _, n := range c.Nodes {
		conn, err := n.Dial()
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			continue
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := f(ch); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		return nil
	}
	return fmt.Errorf("no node accepts AMQP: %w", errors.Join(errs...))
}

// QueueLeader is the node that leads quorum queue (in the default vhost),
// as the first node that answers rabbitmqctl says.
func (c *RabbitCluster) QueueLeader(queue string) (*RabbitNode, error) {
	var errs []error
	for _, n := range c.Nodes {
		out, err := n.Ctl("list_queues", "name", "leader")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == queue {
				for _, m := range c.Nodes {
					if m.Name == f[1] {
						return m, nil
					}
				}
				return nil, fmt.Errorf("queue %s: leader %s is not a node of the cluster", queue, f[1])
			}
		}
		return nil, fmt.Errorf("queue %s: not listed by %s", queue, n.Name)
	}
	return nil, fmt.Errorf("queue %s leader: %w", queue, errors.Join(errs...))
}
