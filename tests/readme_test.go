package tests

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// firstTaskMarker precedes, in README.md, the block of lines that take a
// newcomer from `scripts/dev.sh run` to a task seen arriving.
const firstTaskMarker = "<!-- first-task:"

// readmeBlock returns the fenced block after the line starting with
// marker in README.md, and the quick start's own block before it.
func readmeBlock(t *testing.T, marker string) (quickStart, block string) {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n"+marker)
	if i < 0 {
		t.Fatalf("README.md has no %q line", marker)
	}
	fenced := func(s string) string {
		start := strings.Index(s, "```sh\n")
		if start < 0 {
			t.Fatalf("no ```sh block in %.200q", s)
		}
		s = s[start+len("```sh\n"):]
		end := strings.Index(s, "```")
		if end < 0 {
			t.Fatal("unterminated block in README.md")
		}
		return s[:end]
	}
	qs := strings.Index(text, "## Quick start")
	if qs < 0 || qs > i {
		t.Fatal("README.md has no quick start before the first task")
	}
	_, after, _ := strings.Cut(text[i+1:], "\n") // the lines after the marker's
	if !strings.HasPrefix(after, "```sh\n") {
		t.Fatalf("the %q line is not right before a ```sh block", marker)
	}
	return fenced(text[qs:i]), fenced(after)
}

// TestREADMEFirstTask runs the quick start's `scripts/dev.sh run`, then
// README's first-task lines verbatim, as a newcomer pastes them in a
// second terminal: the task is scheduled, seen arriving with its
// message_id, and stats shows the queue. The environment only isolates
// the run (key prefix, no HTTP port, the test Redis and a private
// RabbitMQ node).
func TestREADMEFirstTask(t *testing.T) {
	quickStart, lines := readmeBlock(t, firstTaskMarker)
	if !strings.Contains(quickStart, "scripts/dev.sh run") {
		t.Fatalf("the quick start does not run scripts/dev.sh run:\n%s", quickStart)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Name(t)
	rdb := testenv.Redis(t)
	testenv.CleanRedis(t, rdb, prefix)
	base := childEnv(map[string]string{
		"DISPATCHER_REDIS_URL": testenv.RedisURL(t),
		// A node of the tests' own: exchange tasks with key default is the
		// dev set-up's, which someone's scripts/dev.sh run may be using.
		"DISPATCHER_AMQP_URL":   testenv.PrivateRabbit(t).AMQPURL(),
		"DISPATCHER_KEY_PREFIX": prefix,
	})

	// Terminal 1: scripts/dev.sh run, the servers being up already.
	dev := exec.Command("scripts/dev.sh", "run")
	dev.Dir = root
	dev.Env = append(base, "DEV_SKIP_SERVICES=1", "DISPATCHER_HTTP_ADDR=")
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	devOut := &syncBuffer{}
	dev.Stdout, dev.Stderr = devOut, devOut
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	devDone := make(chan struct{})
	go func() { _ = dev.Wait(); close(devDone) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-dev.Process.Pid, syscall.SIGTERM)
		select {
		case <-devDone:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
			<-devDone
		}
		if t.Failed() {
			t.Logf("scripts/dev.sh run:\n%s", tail(devOut.String(), 4000))
		}
	})
	eventually(t, 3*time.Minute, "scripts/dev.sh run to build and start the dispatcher", func() bool {
		select {
		case <-devDone:
			t.Fatalf("scripts/dev.sh run exited:\n%s", devOut.String())
		default:
		}
		return strings.Contains(devOut.String(), "broker connected")
	})

	// Terminal 2: the lines, verbatim.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-e", "-c", lines)
	sh.Dir = root
	sh.Env = base
	var out, errOut bytes.Buffer
	sh.Stdout, sh.Stderr = &out, &errOut
	if err := sh.Run(); err != nil {
		t.Fatalf("README's first-task lines failed: %v\n%s\nstdout:\n%s\nstderr:\n%s", err, lines, out.String(), errOut.String())
	}
	for _, want := range []string{
		"scheduled on default shard",
		`message_id=`,
		`body="hello, dispatcher"`,
		"greeting-1", // the id, in x-task-id
		"queue default is swept by",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s\nstderr:\n%s", want, out.String(), errOut.String())
		}
	}
	t.Logf("README's first task:\n%s", out.String())
}
