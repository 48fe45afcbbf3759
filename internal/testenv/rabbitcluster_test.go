package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMain stops the private RabbitMQ nodes the tests started.
func TestMain(m *testing.M) {
	code := m.Run()
	StopSharedRabbitCluster()
	StopPrivateRabbit()
	os.Exit(code)
}

// publishConfirmed publishes body through url and waits for the broker's
// confirm; an error if it is refused, closed, nacked or not confirmed.
func publishConfirmed(url, exchange, key, body string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	if err != nil {
		return err
	}
	acked, err := conf.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !acked {
		return fmt.Errorf("publish of %q nacked", body)
	}
	return nil
}

// getOne gets a message of queue through url, waiting up to timeout for one.
func getOne(t *testing.T, url, queue string, timeout time.Duration) string {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s through %s: %v", queue, url, err)
		}
		if ok {
			return string(d.Body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message in %s through %s after %s", queue, url, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantRunning checks that each node of on sees the nodes of want running,
// and no other; the rabbitmqctl calls, 1-2 s each, run at once.
func wantRunning(t *testing.T, c *RabbitCluster, on []*RabbitNode, want ...*RabbitNode) {
	t.Helper()
	var names []string
	for _, n := range want {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	errs := make([]error, len(on))
	var wg sync.WaitGroup
	for i, n := range on {
		wg.Go(func() {
			running, err := c.RunningNodes(n)
			slices.Sort(running)
			if err == nil && !slices.Equal(running, names) {
				err = fmt.Errorf("%s sees running %v; want %v", n.Name, running, names)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func TestRabbitCluster(t *testing.T) {
	c := SharedRabbitCluster(t)
	start := time.Now()
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	wantRunning(t, c, c.Nodes, c.Nodes...)
	for _, n := range c.Nodes {
		if got := c.NodeAt(fmt.Sprintf("127.0.0.1:%d", n.Port)); got != n {
			t.Fatalf("NodeAt port %d = %v", n.Port, got)
		}
	}
	if c.NodeAt("127.0.0.1:1") != nil {
		t.Fatal("NodeAt of a port no node listens on")
	}

	q := Name(t)
	ex := q + "-ex"
	remove, err := c.DeclareQuorumQueue(q, ex, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := remove(); err != nil {
			t.Error(err)
		}
	}()
	urls := c.URLs()
	if err := publishConfirmed(urls[0], ex, "k", "via node 1", 10*time.Second); err != nil {
		t.Fatalf("publish through %s: %v", n1.Name, err)
	}
	if got := getOne(t, urls[2], q, 5*time.Second); got != "via node 1" {
		t.Fatalf("got %q through %s", got, n3.Name)
	}

	// Node 1, where the queue was declared and most likely leads, is cut
	// off: a connection open to it is closed, new ones are refused, and the
	// other two go on (electing another leader if need be).
	conn, err := n1.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	step := time.Now()
	if err := c.Isolate(n1); err != nil {
		t.Fatal(err)
	}
	t.Logf("isolate: %s", time.Since(step).Round(time.Millisecond))
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("connection to isolated %s still open", n1.Name)
	}
	wantRunning(t, c, []*RabbitNode{n2, n3}, n2, n3)
	// rabbitmqctl still reaches the isolated node, which has paused and
	// is connected to neither of the others.
	if out, err := n1.Ctl("eval", "{rabbit:is_running(), nodes()}."); err != nil {
		t.Fatal(err)
	} else if !strings.HasPrefix(out, "{false,") || strings.Contains(out, n2.Name) || strings.Contains(out, n3.Name) {
		t.Fatalf("isolated %s: {rabbit:is_running(), nodes()} = %s", n1.Name, out)
	}
	if err := publishConfirmed(urls[0], ex, "k", "via isolated node 1", 5*time.Second); err == nil {
		t.Fatalf("publish through isolated %s confirmed", n1.Name)
	} else {
		t.Logf("publish through isolated %s: %v", n1.Name, err)
	}
	step = time.Now()
	if err := publishConfirmed(urls[1], ex, "k", "via node 2", 20*time.Second); err != nil {
		t.Fatalf("publish through %s during the partition: %v", n2.Name, err)
	}
	t.Logf("publish through node 2 during the partition: %s", time.Since(step).Round(time.Millisecond))

	step = time.Now()
	if err := c.Heal(n1); err != nil {
		t.Fatal(err)
	}
	t.Logf("heal: %s", time.Since(step).Round(time.Millisecond))
	wantRunning(t, c, c.Nodes, c.Nodes...)
	if got := getOne(t, urls[0], q, 10*time.Second); got != "via node 2" {
		t.Fatalf("got %q through %s", got, n1.Name)
	}
	t.Logf("test body: %s", time.Since(start).Round(time.Millisecond))
}

// TestRabbitClusterCrashBoot: a node killed and booted again on its data
// rejoins the cluster by itself.
func TestRabbitClusterCrashBoot(t *testing.T) {
	c := SharedRabbitCluster(t)
	start := time.Now()
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	n2.Crash()
	wantRunning(t, c, []*RabbitNode{n1, n3}, n1, n3)
	if err := n2.Boot(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitJoined(30 * time.Second); err != nil {
		t.Fatalf("after %s crashed and booted: %v", n2.Name, err)
	}
	t.Logf("crash and boot: %s", time.Since(start).Round(time.Millisecond))
}
