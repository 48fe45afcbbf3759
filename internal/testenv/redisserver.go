package testenv

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions configure a private redis-server. The zero value is a plain
// server without persistence.
type RedisOptions struct {
	// AOF turns on appendonly; AppendFsync is "always" (the default: every
	// acknowledged write survives a SIGKILL) or "everysec".
	AOF         bool
	AppendFsync string
	// MaxMemory (e.g. "8mb") and MaxMemoryPolicy (e.g. "noeviction").
	MaxMemory       string
	MaxMemoryPolicy string
	// TLS, when set, makes the server speak TLS only (port 0, tls-port)
	// with these certificates; TLSAuthClients demands a client certificate.
	TLS            *Certs
	TLSAuthClients bool
	// Users are ACL file lines ("user app on >pw ~app:* +get"). When any is
	// given, an extra user "admin" with every right is added for Client.
	Users []string
	// Args are extra config lines, e.g. "enable-debug-command local".
	Args []string
	// Sentinel runs the server as a Redis Sentinel (redis-server <conf>
	// --sentinel); Args then carry the "sentinel ..." lines.
	Sentinel bool
	// Env is added to the server's environment (ClockShift.Env).
	Env []string

	// clusterBus draws a cluster bus port (cluster-port) with the port.
	clusterBus bool
}

// RedisServer is a redis-server process owned by one test, in a temporary
// directory, on a free port. Tests may kill and restart it; it is always
// stopped when the test ends.
type RedisServer struct {
	t        testing.TB
	opt      RedisOptions
	Dir      string
	Port     int
	busPort  int // cluster-port, with RedisOptions.clusterBus
	conf     string
	adminPwd string
	logFrom  int64 // the log's size when the last launch began

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

// StartRedis starts a private redis-server and waits until it answers.
func StartRedis(t testing.TB, opt RedisOptions) *RedisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not installed (scripts/dev.sh installs it): %v", err)
	}
	s := &RedisServer{t: t, opt: opt, Dir: t.TempDir(), adminPwd: "admin-" + randomHex()}
	s.conf = filepath.Join(s.Dir, "redis.conf")
	if len(opt.Users) > 0 {
		users := append([]string{"user admin on >" + s.adminPwd + " ~* &* +@all"}, opt.Users...)
		if err := os.WriteFile(filepath.Join(s.Dir, "users.acl"), []byte(strings.Join(users, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(s.stop)
	// A cluster-enabled server needs a bus port: Redis's default, the
	// port + 10000, fails for a drawn port above 55535.
	if slices.Contains(opt.Args, "cluster-enabled yes") {
		opt.clusterBus = true
		s.opt = opt
	}
	n := 1
	if opt.clusterBus {
		n = 2
	}
	err := startOnPorts(n, t.Logf, func(ports []int) error {
		s.Port = ports[0]
		if opt.clusterBus {
			s.busPort = ports[1]
		}
		if err := os.WriteFile(s.conf, []byte(s.config()), 0o600); err != nil {
			return err
		}
		if err := s.launch(); err != nil {
			return err
		}
		err := s.waitUp(20*time.Second, true)
		if errors.Is(err, errPortTaken) {
			s.Kill()
			err = errors.Join(err, s.clearAttempt())
		}
		return err
	})
	if err != nil {
		t.Fatalf("private redis-server: %v", err)
	}
	return s
}

// clearAttempt removes what a start that failed left in Dir (nodes.conf
// of a cluster node) but the configuration and the log.
func (s *RedisServer) clearAttempt() error {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch e.Name() {
		case "redis.conf", "users.acl", "redis.log":
		default:
			if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *RedisServer) config() string {
	o := s.opt
	lines := []string{
		"bind 127.0.0.1",
		"dir " + s.Dir,
		"logfile " + filepath.Join(s.Dir, "redis.log"),
		"daemonize no",
		`save ""`,
		"appendonly no",
	}
	if o.TLS != nil {
		auth := "no"
		if o.TLSAuthClients {
			auth = "yes"
		}
		lines = append(lines, "port 0", "tls-port "+strconv.Itoa(s.Port),
			"tls-cert-file "+o.TLS.ServerCert, "tls-key-file "+o.TLS.ServerKey,
			"tls-ca-cert-file "+o.TLS.CA, "tls-auth-clients "+auth)
	} else {
		lines = append(lines, "port "+strconv.Itoa(s.Port))
	}
	if s.busPort != 0 {
		lines = append(lines, "cluster-port "+strconv.Itoa(s.busPort))
	}
	if o.AOF {
		fsync := o.AppendFsync
		if fsync == "" {
			fsync = "always"
		}
		lines = append(lines, "appendonly yes", "appendfsync "+fsync)
	}
	if o.MaxMemory != "" {
		lines = append(lines, "maxmemory "+o.MaxMemory)
	}
	if o.MaxMemoryPolicy != "" {
		lines = append(lines, "maxmemory-policy "+o.MaxMemoryPolicy)
	}
	if len(o.Users) > 0 {
		lines = append(lines, "aclfile "+filepath.Join(s.Dir, "users.acl"))
	}
	lines = append(lines, o.Args...)
	return strings.Join(lines, "\n") + "\n"
}

func (s *RedisServer) launch() error {
	// Config errors go to stderr, before the log file is open.
	out, err := os.OpenFile(filepath.Join(s.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if st, err := out.Stat(); err == nil {
		s.logFrom = st.Size()
	}
	args := []string{s.conf}
	if s.opt.Sentinel {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = out, out
	if len(s.opt.Env) > 0 {
		cmd.Env = append(os.Environ(), s.opt.Env...)
	}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// Addr is the server's host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the server's URL for the admin (or, without ACL users, default)
// user: redis:// or, with TLS, rediss://.
func (s *RedisServer) URL() string {
	return s.URLFor("admin", s.adminPwd)
}

// URLFor is the server's URL for user with password; user "" means the
// default user without a password.
func (s *RedisServer) URLFor(user, password string) string {
	scheme := "redis"
	if s.opt.TLS != nil {
		scheme = "rediss"
	}
	if user == "" || (user == "admin" && len(s.opt.Users) == 0) {
		return scheme + "://" + s.Addr() + "/0"
	}
	return scheme + "://" + user + ":" + password + "@" + s.Addr() + "/0"
}

// Client returns an admin client of the server (TLS and ACL handled),
// closed when the test ends.
func (s *RedisServer) Client() *redis.Client {
	s.t.Helper()
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		s.t.Fatal(err)
	}
	if s.opt.TLS != nil {
		opt.TLSConfig = s.clientTLS()
	}
	c := redis.NewClient(opt)
	s.t.Cleanup(func() { c.Close() })
	return c
}

func (s *RedisServer) clientTLS() *tls.Config {
	s.t.Helper()
	ca, err := os.ReadFile(s.opt.TLS.CA)
	if err != nil {
		s.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	pair, err := tls.LoadX509KeyPair(s.opt.TLS.ClientCert, s.opt.TLS.ClientKey)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.Certificates = []tls.Certificate{pair}
	return cfg
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it.
// A paused server is resumed first.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	cmd, done, paused := s.cmd, s.done, s.paused
	s.paused = false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	_ = cmd.Process.Kill()
	<-done
}

// PID is the process id of the server, 0 if it has exited.
func (s *RedisServer) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the process is alive (a paused one is).
func (s *RedisServer) Running() bool { return s.PID() != 0 }

// Paused reports whether the process is stopped by Pause.
func (s *RedisServer) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

func (s *RedisServer) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Pause stops the process with SIGSTOP: it keeps its port and connections
// but answers nothing until Resume (or Kill/Restart, or the test's end).
func (s *RedisServer) Pause() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		s.t.Fatalf("pause %s: not running", s)
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pause %s: %v", s, err)
	}
	s.paused = true
}

// Resume continues a paused process with SIGCONT.
func (s *RedisServer) Resume() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.exited() {
		s.t.Fatalf("resume %s: not running", s)
	}
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("resume %s: %v", s, err)
	}
	s.paused = false
}

// Restart starts the server again on the same port and directory, so it
// loads what it persisted. It waits only until the server answers at all:
// a LOADING reply counts; use WaitLoaded to wait for the data.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.launch(); err != nil {
		s.t.Fatal(err)
	}
	if err := s.waitUp(20*time.Second, false); err != nil {
		s.t.Fatal(err)
	}
}

// WaitLoaded waits until the server answers PING with PONG.
func (s *RedisServer) WaitLoaded(timeout time.Duration) {
	s.t.Helper()
	if err := s.waitUp(timeout, true); err != nil {
		s.t.Fatal(err)
	}
}

// waitUp waits until this process answers on the port: a PING answered,
// with PONG or (unless loaded) LOADING, and INFO naming its pid, not
// another server's. If it exited unable to bind a port, the error wraps
// errPortTaken.
func (s *RedisServer) waitUp(timeout time.Duration, loaded bool) error {
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		return err
	}
	if s.opt.TLS != nil {
		opt.TLSConfig = s.clientTLS()
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	deadline := time.Now().Add(timeout)
	s.mu.Lock()
	pid, done := s.cmd.Process.Pid, s.done
	s.mu.Unlock()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = c.Ping(ctx).Err()
		if err == nil || (!loaded && redis.HasErrorPrefix(err, "LOADING")) {
			// A server that bound the port first answers too.
			var info string
			if info, err = c.Info(ctx, "server").Result(); err == nil || (!loaded && redis.HasErrorPrefix(err, "LOADING")) {
				cancel()
				if got := redisInfoField(info, "process_id"); got != strconv.Itoa(pid) && err == nil {
					return fmt.Errorf("%s: the port answers as pid %s, not %d: %w", s, got, pid, errPortTaken)
				}
				return nil
			}
		}
		cancel()
		select {
		case <-done:
			log := s.logSinceLaunch()
			if bindFailed(log) {
				return fmt.Errorf("%s exited: %w\n%s", s, errPortTaken, tail(log, 2000))
			}
			return fmt.Errorf("%s exited:\n%s", s, tail(log, 2000))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not up after %s (%v): %s", s, timeout, err, s.LogTail(2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logSinceLaunch is what the server logged since its last launch.
func (s *RedisServer) logSinceLaunch() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if int64(len(b)) >= s.logFrom {
		b = b[s.logFrom:]
	}
	return string(b)
}

// LogTail returns the last n bytes of the server's log file.
func (s *RedisServer) LogTail(n int) string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (s *RedisServer) stop() {
	s.Kill()
	if s.t.Failed() {
		s.t.Logf("private redis-server %s log:\n%s", s.Addr(), s.LogTail(3000))
	}
}

// String names the server in messages.
func (s *RedisServer) String() string { return fmt.Sprintf("redis-server %s", s.Addr()) }
