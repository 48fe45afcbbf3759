package testenv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitServer is the real start script; /usr/sbin/rabbitmq-server only
// wraps it with su and redirects its output to the shared node's log.
const rabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// RabbitNode is a private RabbitMQ node for destructive tests (stopping
// the broker, alarms): the shared broker on 5672 serves every test running
// on the machine and must never be touched. It listens on 127.0.0.1 with
// plain AMQP and with AMQPS that requires a client certificate signed by
// Certs.CA. The default user guest/guest may log in (from loopback only).
type RabbitNode struct {
	Name    string // Erlang node name, for rabbitmqctl -n
	Port    int    // AMQP port
	TLSPort int    // AMQPS port (verify_peer, fail_if_no_peer_cert)
	Certs   Certs  // the node's CA, server certificate and a client certificate for it

	mu        sync.Mutex
	alarmsSet map[string]bool // by SetAlarm, cleared by restore
	proc      *nodeProc       // the running server; replaced by Boot

	dir       string
	extraConf string // added to rabbitmq.conf
	env       []string
	cred      *syscall.Credential
	out       *os.File
	stop      sync.Once
}

// nodeProc is one run of the node's server process.
type nodeProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

var (
	sharedNodeOnce sync.Once
	sharedNode     *RabbitNode
	sharedNodeErr  error
	nodeSeq        atomic.Int64
)

// PrivateRabbit returns the private node shared by the tests of this test
// binary, starting it on first use (7-10 s). Tests run one after another
// on it, so when the test ends its cleanup puts the node back the way the
// next test expects it: application running, no alarm. Call
// StopPrivateRabbit from TestMain after m.Run; if the test binary dies
// first, the kernel kills the node (parent-death signal).
func PrivateRabbit(t testing.TB) *RabbitNode {
	t.Helper()
	sharedNodeOnce.Do(func() { sharedNode, sharedNodeErr = startRabbitNode(t) })
	if sharedNodeErr != nil {
		t.Fatalf("private RabbitMQ node: %v", sharedNodeErr)
	}
	n := sharedNode
	t.Cleanup(func() {
		if err := n.restore(); err != nil {
			t.Errorf("restore private RabbitMQ node %s: %v", n.Name, err)
		}
	})
	return n
}

// StopPrivateRabbit stops the node PrivateRabbit started, if any.
func StopPrivateRabbit() {
	if sharedNode != nil {
		sharedNode.Stop()
	}
}

// NewRabbitNode starts a node of the test's own, stopped when it ends.
func NewRabbitNode(t testing.TB) *RabbitNode {
	t.Helper()
	n, err := startRabbitNode(t)
	if err != nil {
		t.Fatalf("private RabbitMQ node: %v", err)
	}
	t.Cleanup(n.Stop)
	return n
}

// AMQPURL is the node's plain AMQP URL.
func (n *RabbitNode) AMQPURL() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.Port)
}

// AMQPSURL is the node's AMQPS URL for user and password; the host is
// localhost, the name in the server certificate.
func (n *RabbitNode) AMQPSURL(user, password string) string {
	return fmt.Sprintf("amqps://%s:%s@localhost:%d/", user, password, n.TLSPort)
}

// Dial connects to the node over plain AMQP; the test closes it.
func (n *RabbitNode) Dial() (*amqp.Connection, error) {
	return amqp.DialConfig(n.AMQPURL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
}

// Ctl runs rabbitmqctl against this node only and returns its output.
func (n *RabbitNode) Ctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q", "-n", n.Name}, args...)...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Only the command is named: its arguments may hold a password.
		return string(out), fmt.Errorf("rabbitmqctl %s on %s: %w: %s", args[0], n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// StopApp stops the RabbitMQ application; the Erlang node stays up and
// every client connection is closed.
func (n *RabbitNode) StopApp() error {
	_, err := n.Ctl("stop_app")
	return err
}

// StartApp starts the application again and waits until it accepts AMQP
// connections.
func (n *RabbitNode) StartApp() error {
	if _, err := n.Ctl("start_app"); err != nil {
		return err
	}
	return n.waitAMQP(60 * time.Second)
}

// Outage is when the broker application was down.
type Outage struct{ Stopped, Started time.Time }

// AppOutages stops the RabbitMQ application at each of the times in at and
// starts it again after down: rabbit:stop() and rabbit:start(), what
// rabbitmqctl stop_app and start_app call. All of it runs in one
// rabbitmqctl eval, so that the timing does not depend on how long the CLI
// takes to start, which on a busy machine is seconds; a time already past
// when its turn comes means at once. It returns when each outage really
// began (the application had stopped) and ended (it was running again).
func (n *RabbitNode) AppOutages(at []time.Time, down time.Duration) ([]Outage, error) {
	ms := make([]string, len(at))
	for i, t := range at {
		ms[i] = strconv.FormatInt(t.UnixMilli(), 10)
	}
	expr := fmt.Sprintf(`lists:map(fun(At) ->
		timer:sleep(max(0, At - os:system_time(millisecond))),
		ok = rabbit:stop(),
		Stopped = os:system_time(millisecond),
		timer:sleep(%d),
		ok = rabbit:start(),
		{Stopped, os:system_time(millisecond)}
	end, [%s]).`, down.Milliseconds(), strings.Join(ms, ","))
	// One line: rabbitmqctl passes its arguments on through su -c.
	out, err := n.Ctl("eval", strings.Join(strings.Fields(expr), " "))
	if err != nil {
		return nil, err
	}
	var outages []Outage
	for _, m := range outageRE.FindAllStringSubmatch(out, -1) {
		stopped, _ := strconv.ParseInt(m[1], 10, 64)
		started, _ := strconv.ParseInt(m[2], 10, 64)
		outages = append(outages, Outage{time.UnixMilli(stopped), time.UnixMilli(started)})
	}
	if len(outages) != len(at) {
		return outages, fmt.Errorf("rabbitmqctl eval on %s: unexpected output %q", n.Name, out)
	}
	return outages, n.waitAMQP(30 * time.Second)
}

var outageRE = regexp.MustCompile(`\{(\d+),(\d+)\}`)

// SetAlarm sets off the node's "memory" or "disk" alarm the way a node
// short of either sees it: the limit is moved past what the node has, so
// the node blocks publishing connections (connection.blocked).
func (n *RabbitNode) SetAlarm(resource string) error {
	args, err := alarmArgs(resource, true)
	if err != nil {
		return err
	}
	if _, err = n.Ctl(args...); err != nil {
		return err
	}
	n.mu.Lock()
	n.alarmsSet[resource] = true
	n.mu.Unlock()
	return nil
}

// ClearAlarm puts the limit of resource back to RabbitMQ's default.
func (n *RabbitNode) ClearAlarm(resource string) error {
	args, err := alarmArgs(resource, false)
	if err != nil {
		return err
	}
	if _, err = n.Ctl(args...); err != nil {
		return err
	}
	n.mu.Lock()
	delete(n.alarmsSet, resource)
	n.mu.Unlock()
	return nil
}

func alarmArgs(resource string, set bool) ([]string, error) {
	switch {
	case resource == "memory" && set:
		return []string{"set_vm_memory_high_watermark", "absolute", "1"}, nil
	case resource == "memory":
		return []string{"set_vm_memory_high_watermark", "0.4"}, nil
	case resource == "disk" && set:
		return []string{"set_disk_free_limit", "1000000GB"}, nil
	case resource == "disk":
		return []string{"set_disk_free_limit", "50MB"}, nil
	}
	return nil, fmt.Errorf("no alarm %q: want memory or disk", resource)
}

// Alarms lists the node's resource alarms in effect ("memory", "disk").
func (n *RabbitNode) Alarms() ([]string, error) {
	out, err := n.Ctl("eval", `[R || {{resource_limit, R, _}, _} <- rabbit_alarm:get_alarms()].`)
	if err != nil {
		return nil, err
	}
	s := strings.Trim(strings.TrimSpace(out), "[]")
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, ","), nil
}

// AddUser adds a user with full permissions on the default vhost, deleted
// when the test ends.
func (n *RabbitNode) AddUser(t testing.TB, name, password string) {
	t.Helper()
	if _, err := n.Ctl("add_user", name, password); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = n.Ctl("delete_user", name) })
	if _, err := n.Ctl("set_permissions", "-p", "/", name, ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}
}

// restore brings the node back to its normal state after a test: the
// application running and no alarm.
func (n *RabbitNode) restore() error {
	select {
	case <-n.current().done:
		if err := n.Boot(); err != nil {
			return err
		}
	default:
	}
	if err := n.ping(); err != nil {
		if err := n.StartApp(); err != nil {
			return err
		}
	}
	n.mu.Lock()
	set := slices.Collect(maps.Keys(n.alarmsSet))
	n.mu.Unlock()
	if len(set) == 0 {
		return nil
	}
	for _, a := range set {
		if err := n.ClearAlarm(a); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alarms, err := n.Alarms()
		if err != nil || len(alarms) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("alarms %v still set", alarms)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the node, kills it if it does not stop within 10 s, and
// removes its files. It may be called more than once.
func (n *RabbitNode) Stop() {
	n.stop.Do(func() {
		p := n.current()
		_ = p.cmd.Process.Signal(syscall.SIGTERM) // erl stops cleanly on SIGTERM
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		n.out.Close()
		os.RemoveAll(n.dir)
	})
}

// Crash kills the node's server with SIGKILL, as a machine or OOM-killer
// crash would: no connection is closed cleanly, and only what the node had
// written to disk survives. Boot brings it back.
func (n *RabbitNode) Crash() {
	p := n.current()
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Boot starts the node's server on its existing data (after Crash) and
// waits until it accepts AMQP connections.
func (n *RabbitNode) Boot() error {
	// RABBITMQ_ALLOW_INPUT makes the script exec erl in the foreground, so
	// the process started here is the node itself and the parent-death
	// signal reaches it; -noinput then keeps it from reading stdin.
	cmd := exec.Command(rabbitServer)
	cmd.Dir = n.dir
	cmd.Env = append(slices.Clip(n.env), "RABBITMQ_ALLOW_INPUT=1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-noinput -kernel inet_dist_use_interface {127,0,0,1}")
	cmd.Stdout, cmd.Stderr = n.out, n.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	from := n.logSizes()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", rabbitServer, err)
	}
	p := &nodeProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	if err := n.waitAMQP(90 * time.Second); err != nil {
		select {
		case <-p.done:
			if bindFailed(n.logsSince(from)) {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
		default:
		}
		return fmt.Errorf("node %s did not come up: %w\n%s", n.Name, err, n.logTail())
	}
	return nil
}

// logFiles are the node's console output and its log file.
func (n *RabbitNode) logFiles() []string {
	return []string{filepath.Join(n.dir, "console.log"), filepath.Join(n.dir, "log", n.Name+".log")}
}

// logSizes are the sizes of logFiles now (0 for one not yet written).
func (n *RabbitNode) logSizes() []int64 {
	var sizes []int64
	for _, f := range n.logFiles() {
		var size int64
		if st, err := os.Stat(f); err == nil {
			size = st.Size()
		}
		sizes = append(sizes, size)
	}
	return sizes
}

// logsSince is what logFiles gained past sizes.
func (n *RabbitNode) logsSince(sizes []int64) string {
	var b strings.Builder
	for i, f := range n.logFiles() {
		data, _ := os.ReadFile(f)
		if int64(len(data)) >= sizes[i] {
			b.Write(data[sizes[i]:])
		}
	}
	return b.String()
}

func (n *RabbitNode) current() *nodeProc {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

// startRabbitNode starts a node in a new directory that user rabbitmq can
// write (the server and rabbitmqctl run as that user), listening on free
// ports, and waits until it accepts AMQP connections.
func startRabbitNode(t testing.TB) (*RabbitNode, error) {
	n, err := newRabbitNode(t, "")
	if err != nil {
		return nil, err
	}
	started := time.Now()
	if err := n.firstBoot(t.Logf); err != nil {
		return nil, err
	}
	t.Logf("private RabbitMQ node %s up in %s: amqp 127.0.0.1:%d, amqps 127.0.0.1:%d",
		n.Name, time.Since(started).Round(time.Millisecond), n.Port, n.TLSPort)
	return n, nil
}

// newRabbitNode prepares a node's directory without starting it;
// firstBoot configures it (rabbitmq.conf plus extraConf) on free ports and
// boots it.
func newRabbitNode(t testing.TB, extraConf string) (*RabbitNode, error) {
	if _, err := os.Stat(rabbitServer); err != nil {
		return nil, fmt.Errorf("rabbitmq-server is not installed: %w", err)
	}
	cred, err := rabbitCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dispatcher-rabbit")
	if err != nil {
		return nil, err
	}
	n := &RabbitNode{dir: dir, extraConf: extraConf, cred: cred, alarmsSet: map[string]bool{}}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, err
	}
	n.Name = fmt.Sprintf("dispatcher-test-%d-%d@localhost", os.Getpid(), nodeSeq.Add(1))
	if n.Certs, err = copyCerts(NewCerts(t), filepath.Join(dir, "certs")); err != nil {
		return nil, err
	}
	if n.out, err = os.Create(filepath.Join(dir, "console.log")); err != nil {
		return nil, err
	}
	ok = true
	return n, nil
}

// configure writes the node's configuration and environment for ports:
// AMQP, AMQPS and Erlang distribution.
func (n *RabbitNode) configure(ports []int) error {
	dir := n.dir
	n.Port, n.TLSPort = ports[0], ports[1]
	conf := fmt.Sprintf(`listeners.tcp.default = 127.0.0.1:%d
listeners.ssl.default = 127.0.0.1:%d
ssl_options.cacertfile = %s
ssl_options.certfile = %s
ssl_options.keyfile = %s
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
vm_memory_high_watermark.relative = 0.4
log.file.level = info
log.console = false
`, n.Port, n.TLSPort, n.Certs.CA, n.Certs.ServerCert, n.Certs.ServerKey) + n.extraConf
	files := map[string]string{
		"rabbitmq.conf":   conf,
		"enabled_plugins": "[].\n",
		// Replaces /etc/rabbitmq/rabbitmq-env.conf, whose NODENAME is the
		// shared node's.
		"rabbitmq-env.conf": "ERL_EPMD_ADDRESS=127.0.0.1\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	n.env = append(cleanEnv(),
		"HOME=/var/lib/rabbitmq", // the Erlang cookie rabbitmqctl uses too
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_NODENAME="+n.Name,
		"RABBITMQ_DIST_PORT="+strconv.Itoa(ports[2]),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	return nil
}

// firstBoot configures a node newRabbitNode prepared on free ports and
// boots it, on new ports while a port is taken before the node binds it;
// if it does not come up, the node is stopped and its files removed.
func (n *RabbitNode) firstBoot(logf func(string, ...any)) error {
	err := startOnPorts(3, logf, func(ports []int) error {
		if err := n.configure(ports); err != nil {
			return err
		}
		err := n.Boot()
		if err == nil {
			err = n.ownsPort()
		}
		if errors.Is(err, errPortTaken) {
			// It exited: boot the next attempt on no data of this one.
			for _, d := range []string{"mnesia", "log"} {
				if rmErr := os.RemoveAll(filepath.Join(n.dir, d)); rmErr != nil {
					return errors.Join(err, rmErr)
				}
			}
		}
		return err
	})
	if err != nil {
		n.discard()
		return err
	}
	return nil
}

// ownsPort checks that the AMQP port is this node's and not another's
// that bound it first: a new node's cluster name is its own node name
// (with the machine's full host name). If it is not, the node is killed.
func (n *RabbitNode) ownsPort() error {
	c, err := n.Dial()
	if err != nil {
		return err
	}
	defer c.Close()
	short, _, _ := strings.Cut(n.Name, "@")
	if name, ok := c.Properties["cluster_name"].(string); ok && !strings.HasPrefix(name, short+"@") {
		n.Crash()
		return fmt.Errorf("node %s: port %d answers as %s: %w", n.Name, n.Port, name, errPortTaken)
	}
	return nil
}

// discard stops the node if it was ever started and removes its files.
func (n *RabbitNode) discard() {
	if n.current() != nil {
		n.Stop()
		return
	}
	n.out.Close()
	os.RemoveAll(n.dir)
}

// rabbitCredential is who the node runs as: user rabbitmq, whose home
// holds the Erlang cookie that rabbitmqctl presents.
func rabbitCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return nil, fmt.Errorf("no user rabbitmq (is rabbitmq-server installed?): %w", err)
	}
	if cur := strconv.Itoa(os.Geteuid()); cur == u.Uid {
		return nil, nil
	} else if cur != "0" {
		return nil, errors.New("a private RabbitMQ node needs root or user rabbitmq to run its server")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// cleanEnv is this process's environment without RabbitMQ or Erlang
// settings that would leak into the node.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "RABBITMQ_") || strings.HasPrefix(k, "ERL_") || k == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (n *RabbitNode) ping() error {
	c, err := n.Dial()
	if err != nil {
		return err
	}
	return c.Close()
}

func (n *RabbitNode) waitAMQP(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := n.ping()
		if err == nil {
			return nil
		}
		select {
		case <-n.current().done:
			return errors.New("the node exited")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no AMQP on port %d after %s: %w", n.Port, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (n *RabbitNode) logTail() string {
	var b strings.Builder
	for _, f := range n.logFiles() {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "--- %s:\n%s\n", f, tail(string(data), 3000))
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// copyCerts copies c's files into dir, which lives as long as the node
// (NewCerts removes its own when the test that made them ends).
func copyCerts(c Certs, dir string) (Certs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Certs{}, err
	}
	out := Certs{Dir: dir}
	for _, f := range []struct {
		src string
		dst *string
	}{
		{c.CA, &out.CA}, {c.ServerCert, &out.ServerCert}, {c.ServerKey, &out.ServerKey},
		{c.ClientCert, &out.ClientCert}, {c.ClientKey, &out.ClientKey},
	} {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return Certs{}, err
		}
		*f.dst = filepath.Join(dir, filepath.Base(f.src))
		if err := os.WriteFile(*f.dst, data, 0o644); err != nil {
			return Certs{}, err
		}
	}
	return out, nil
}
