package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// The producer packages in clients/ and the drivers that run them here.
const (
	clientPython      = "../clients/python"
	clientNode        = "../clients/node"
	clientDriverPy    = "testdata/clients/driver.py"
	clientDriverNode  = "testdata/clients/driver.js"
	clientQueue       = "clients"
	clientQueueShards = 8
)

// runIn runs a command in dir with extra environment and stdin to its end,
// and returns its standard output; it fails the test on a non-zero exit.
func runIn(t *testing.T, dir string, env []string, stdin []byte, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t.Logf("running %s (in %s)", strings.Join(cmd.Args, " "), dir)
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(cmd.Args, " "), err, tail(stdout.String(), 4000),
			tail(stderr.String(), 4000))
	}
	return stdout.String()
}

// requireClientPython fails the test, never skips it, when Debian's Python
// lacks what the Python package needs to be tested and installed.
func requireClientPython(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(systemPython, "-c", "import setuptools, wheel, pip, venv, redis, xxhash").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot test and install clients/python (%v: %s): run scripts/dev.sh test, which installs "+
			"python3-redis python3-xxhash python3-pip python3-setuptools python3-wheel", systemPython, err,
			strings.TrimSpace(string(out)))
	}
}

// requireNode fails the test, never skips it, when node or npm is missing.
func requireNode(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run scripts/dev.sh test, which installs nodejs and npm", tool)
		}
	}
}

var nodeModules sync.Mutex

// ensureNodeModules runs npm ci in clients/node unless its node_modules is
// already what package-lock.json says (npm's own record of the install is
// newer than the lock): from npm's cache once it has run once.
func ensureNodeModules(t *testing.T) {
	t.Helper()
	requireNode(t)
	nodeModules.Lock()
	defer nodeModules.Unlock()
	lock, err := os.Stat(filepath.Join(clientNode, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if done, err := os.Stat(filepath.Join(clientNode, "node_modules", ".package-lock.json")); err == nil && done.ModTime().After(lock.ModTime()) {
		return
	}
	runIn(t, clientNode, nil, nil, 5*time.Minute, "npm", "ci", "--prefer-offline", "--no-audit", "--no-fund")
}

// TestClientPythonUnit runs the Python package's own tests (the contract's
// test vectors, and the producer against the tests' Redis).
func TestClientPythonUnit(t *testing.T) {
	requireClientPython(t)
	cmd := exec.Command(systemPython, "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Dir = clientPython
	cmd.Env = append(os.Environ(), "PYTHONPATH=.", "DISPATCHER_TEST_REDIS_URL="+testenv.RedisURL(t))
	out, err := cmd.CombinedOutput()
	t.Logf("%s", tail(string(out), 6000))
	if err != nil {
		t.Fatalf("clients/python tests: %v", err)
	}
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindStringSubmatch(string(out))
	if ran == nil || ran[1] == "0" || !regexp.MustCompile(`(?m)^OK$`).Match(out) {
		t.Fatalf("clients/python tests: no \"Ran N tests\" with N > 0 and a plain OK (skips are not passes)")
	}
}

// TestClientNodeUnit runs the Node package's own tests, like the Python ones.
func TestClientNodeUnit(t *testing.T) {
	ensureNodeModules(t)
	cmd := exec.Command("node", "--test", "test/")
	cmd.Dir = clientNode
	cmd.Env = append(os.Environ(), "DISPATCHER_TEST_REDIS_URL="+testenv.RedisURL(t))
	out, err := cmd.CombinedOutput()
	t.Logf("%s", tail(string(out), 6000))
	if err != nil {
		t.Fatalf("clients/node tests: %v", err)
	}
	for _, want := range []string{"# fail 0", "# skipped 0", "# todo 0", "# cancelled 0"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("clients/node tests: no %q in the summary", want)
		}
	}
	if m := regexp.MustCompile(`(?m)^# pass (\d+)$`).FindStringSubmatch(string(out)); m == nil || m[1] == "0" {
		t.Fatal("clients/node tests: no test passed")
	}
}

// clientResult is one line a driver prints.
type clientResult struct {
	Op         string   `json:"op"`
	Module     string   `json:"module"`
	Shards     []int    `json:"shards"`
	DueMs      []int64  `json:"due_ms"`
	MessageIDs []string `json:"message_ids"`
	Result     *bool    `json:"result"`
}

// clientOp is one operation of a driver's request.
type clientOp struct {
	Op     string       `json:"op"`
	Member string       `json:"member,omitempty"`
	InMs   int64        `json:"in_ms,omitempty"`
	Tasks  []clientTask `json:"tasks,omitempty"`
}

type clientTask struct {
	Member string `json:"member"`
	InMs   int64  `json:"in_ms"`
}

// testClientDispatcher schedules tasks through a producer package (run
// runs its driver with a request) while a real dispatcher runs, and checks
// that they arrive on RabbitMQ, each once, with the contract's message_id
// and body, none before its due time; that a reschedule moves a task (only
// the new due time is delivered) and a cancel removes one (never
// delivered); and that reschedule and cancel report false for tasks that
// are not pending.
func testClientDispatcher(t *testing.T, lang string, run func(req []byte) string) {
	h := newHarness(t, queueSpec{Name: clientQueue, Shards: clientQueueShards})
	h.start()
	ctx := context.Background()
	k := shard.Keys{Prefix: h.prefix, Queue: clientQueue}
	// The packages hash with the count the dispatcher records.
	eventually(t, 15*time.Second, "the shard count recorded", func() bool {
		return h.rdb.Get(ctx, k.ShardCount()).Val() == fmt.Sprint(clientQueueShards)
	})

	var batch []clientTask
	for i := 0; i < 30; i++ {
		batch = append(batch, clientTask{Member: fmt.Sprintf("%s-now-%d", lang, i)}) // due at once: woken
		batch = append(batch, clientTask{Member: fmt.Sprintf("%s-soon-%d", lang, i), InMs: 1500})
	}
	batch = append(batch, clientTask{Member: "задача-" + lang, InMs: 1000}, clientTask{Member: `{"id":1}`, InMs: 1200})
	moved, cancelled, never := lang+"-rescheduled", lang+"-cancelled", lang+"-never-scheduled"
	ops := []clientOp{
		{Op: "schedule_many", Tasks: batch},
		{Op: "schedule", Member: moved, InMs: 3_600_000},
		{Op: "reschedule", Member: moved, InMs: 2500},
		// Due before the rescheduled one: had the cancel failed, it would
		// arrive before collecting ends.
		{Op: "schedule", Member: cancelled, InMs: 1500},
		{Op: "cancel", Member: cancelled},
		{Op: "cancel", Member: cancelled},
		{Op: "reschedule", Member: never, InMs: 1000},
	}
	req, err := json.Marshal(map[string]any{"redis": testenv.RedisURL(t), "prefix": h.prefix, "queue": clientQueue, "ops": ops})
	if err != nil {
		t.Fatal(err)
	}
	out := run(req)
	var results []clientResult
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r clientResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("the %s driver printed %q: %v", lang, l, err)
		}
		results = append(results, r)
	}
	if len(results) != len(ops) {
		t.Fatalf("the %s driver printed %d results for %d operations:\n%s", lang, len(results), len(ops), out)
	}
	t.Logf("the %s package ran from %s", lang, results[0].Module)

	// Shards and message ids as package shard computes them.
	want := map[string]int64{}
	bodies := map[string]string{}
	check := func(r clientResult, members []string) {
		t.Helper()
		if len(r.Shards) != len(members) || len(r.MessageIDs) != len(members) || len(r.DueMs) != len(members) {
			t.Fatalf("%s: %+v for %d members", r.Op, r, len(members))
		}
		for n, m := range members {
			if i := shard.Index([]byte(m), clientQueueShards); r.Shards[n] != i {
				t.Errorf("%s %q: shard %d, package shard says %d", r.Op, m, r.Shards[n], i)
			}
			if id := shard.MessageID([]byte(m), r.DueMs[n]); r.MessageIDs[n] != id {
				t.Errorf("%s %q: message id %s, package shard says %s", r.Op, m, r.MessageIDs[n], id)
			}
		}
	}
	var batchMembers []string
	for n, task := range batch {
		batchMembers = append(batchMembers, task.Member)
		want[results[0].MessageIDs[n]] = results[0].DueMs[n]
		bodies[results[0].MessageIDs[n]] = task.Member
	}
	check(results[0], batchMembers)
	check(results[1], []string{moved})
	outcome := func(n int) string {
		if results[n].Result == nil {
			return "nothing"
		}
		return fmt.Sprint(*results[n].Result)
	}
	if got := []string{outcome(2), outcome(4), outcome(5), outcome(6)}; fmt.Sprint(got) != "[true true false false]" {
		t.Fatalf("reschedule, cancel, cancel again, reschedule of a task never scheduled: %v, want [true true false false]", got)
	}
	movedID, hourID := results[2].MessageIDs[0], results[1].MessageIDs[0]
	want[movedID] = results[2].DueMs[0]
	bodies[movedID] = moved
	cancelledID := results[3].MessageIDs[0]
	for _, m := range []string{cancelled, never} {
		if s, err := h.rdb.ZScore(ctx, k.Pending(shard.Index([]byte(m), clientQueueShards)), m).Result(); err == nil {
			t.Errorf("%q is pending (due %v) after the %s package's cancel or reschedule", m, s, lang)
		}
	}

	o := h.verify(clientQueue, want, 30*time.Second, 0)
	for _, r := range h.delivered[clientQueue] {
		id := r.d.MessageId
		switch {
		case id == cancelledID:
			t.Errorf("the cancelled task %s was delivered", id)
		case id == hourID:
			t.Errorf("the rescheduled task was delivered at its old due time (%s)", id)
		case bodies[id] != "" && string(r.d.Body) != bodies[id]:
			t.Errorf("message %s has body %q, scheduled %q", id, r.d.Body, bodies[id])
		}
	}
	// A gross bound only: the tasks due at once were woken, the others found
	// by the sweeps within 500 ms.
	if o.WorstLate > 10*time.Second {
		t.Errorf("a task arrived %s after its due time", o.WorstLate)
	}
	t.Logf("%s package -> dispatcher -> RabbitMQ: %d tasks, worst %s late", lang, o.Delivered, o.WorstLate.Round(time.Millisecond))
}

// TestClientPythonDispatcher installs clients/python into a virtual
// environment with pip, as its README says, and runs it end to end.
func TestClientPythonDispatcher(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	requireClientPython(t)
	dir := t.TempDir()
	// From a copy: pip builds in the source folder, which stays clean.
	src := filepath.Join(dir, "src")
	runIn(t, ".", nil, nil, time.Minute, "cp", "-r", clientPython, src)
	venv := filepath.Join(dir, "venv")
	// The venv sees Debian's redis, xxhash, pip and setuptools; the package
	// goes into the venv alone.
	runIn(t, dir, nil, nil, 2*time.Minute, systemPython, "-m", "venv", "--system-site-packages", "--without-pip", venv)
	py := filepath.Join(venv, "bin", "python")
	runIn(t, dir, nil, nil, 3*time.Minute, py, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
		"--no-index", "--disable-pip-version-check", src)
	driver, err := filepath.Abs(clientDriverPy)
	if err != nil {
		t.Fatal(err)
	}
	testClientDispatcher(t, "python", func(req []byte) string {
		out := runIn(t, dir, []string{"PYTHONPATH="}, req, time.Minute, py, driver)
		if !strings.Contains(out, filepath.Join(venv, "lib")) {
			t.Fatalf("the driver did not import the package installed in %s:\n%s", venv, out)
		}
		return out
	})
}

// TestClientNodeDispatcher packs clients/node with npm pack, installs the
// tarball into an empty project, as its README says, and runs it end to end.
func TestClientNodeDispatcher(t *testing.T) {
	t.Parallel()         // mostly waiting: see the package comment
	ensureNodeModules(t) // its dependencies in npm's cache
	dir := t.TempDir()
	pack := runIn(t, clientNode, nil, nil, 2*time.Minute, "npm", "pack", "--pack-destination", dir, "--silent")
	tgz := filepath.Join(dir, strings.TrimSpace(pack))
	app := filepath.Join(dir, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name":"app","private":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	runIn(t, app, nil, nil, 5*time.Minute, "npm", "install", "--prefer-offline", "--no-audit", "--no-fund", tgz)
	driver, err := os.ReadFile(clientDriverNode)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "driver.js"), driver, 0o644); err != nil {
		t.Fatal(err)
	}
	testClientDispatcher(t, "node", func(req []byte) string {
		out := runIn(t, app, nil, req, time.Minute, "node", "driver.js")
		if !strings.Contains(out, filepath.Join(app, "node_modules", "dispatcher-producer")) {
			t.Fatalf("the driver did not load the package installed in %s:\n%s", app, out)
		}
		return out
	})
}

// fencedBlocks returns the code of the blocks fenced as lang in a Markdown
// file, one after the other.
func fencedBlocks(t *testing.T, path, lang string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	text := string(b)
	for {
		m := fence.FindStringSubmatchIndex(text)
		if m == nil {
			break
		}
		body := strings.TrimPrefix(text[m[1]:], "\n")
		end := strings.Index(body, "\n```")
		if end < 0 {
			t.Fatalf("%s: a code block is not closed", path)
		}
		if text[m[2]:m[3]] == lang {
			code.WriteString(body[:end+1])
		}
		text = body[end+len("\n```"):]
	}
	if code.Len() == 0 {
		t.Fatalf("%s has no %s code block", path, lang)
	}
	return code.String()
}

// TestClientREADMEExamples runs the example of each package's README word
// for word, but for the Redis URL, which points at a private server whose
// queue orders has 16 shards recorded, and checks what it left there:
// {"order":42} rescheduled 5 minutes after {"order":44}, {"order":43}
// cancelled; by id, order-42 with its body and traceparent rescheduled as
// far, order-43 cancelled with its body and properties.
func TestClientREADMEExamples(t *testing.T) {
	const readmeURL = "redis://localhost:6379/0"
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	ctx := context.Background()
	k := shard.Keys{Prefix: shard.DefaultPrefix, Queue: "orders"}
	example := func(t *testing.T, path, lang string) string {
		code := fencedBlocks(t, path, lang)
		if strings.Count(code, readmeURL) != 1 {
			t.Fatalf("%s: the example does not name %s once:\n%s", path, readmeURL, code)
		}
		if err := rdb.FlushAll(ctx).Err(); err != nil { // the test's own server
			t.Fatal(err)
		}
		if err := rdb.Set(ctx, k.ShardCount(), 16, 0).Err(); err != nil {
			t.Fatal(err)
		}
		return strings.Replace(code, readmeURL, srv.URL(), 1)
	}
	check := func(t *testing.T) (due int64) {
		t.Helper()
		score := func(m string) (int64, bool) {
			s, err := rdb.ZScore(ctx, k.Pending(shard.Index([]byte(m), 16)), m).Result()
			return int64(s), err == nil
		}
		s42, ok42 := score(`{"order":42}`)
		s44, ok44 := score(`{"order":44}`)
		_, ok43 := score(`{"order":43}`)
		if !ok42 || !ok44 || ok43 || s42-s44 != 300_000 {
			t.Fatalf("after the example: order 42 pending %v at %d, order 44 pending %v at %d (want 42 due 5 min after 44), "+
				"order 43 pending %v (want cancelled)", ok42, s42, ok44, s44, ok43)
		}
		if lag := time.Until(time.UnixMilli(s44)); lag < 9*time.Minute || lag > 11*time.Minute {
			t.Fatalf("order 44 due in %s, want about 10 minutes", lag)
		}
		// By id: the same due time as the members (one due in the example).
		i42, i43 := shard.Index([]byte("order-42"), 16), shard.Index([]byte("order-43"), 16)
		id42, ok := score("order-42")
		body := rdb.HGet(ctx, k.Tasks(i42), "order-42").Val()
		props, err := shard.ParseProperties([]byte(rdb.HGet(ctx, k.Props(i42), "order-42").Val()))
		if !ok || id42 != s42 || body != `{"order":42}` || err != nil ||
			props.Headers["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
			t.Fatalf("after the example: id order-42 pending %v at %d (want %d), body %q, properties %+v (%v)",
				ok, id42, s42, body, props, err)
		}
		if _, ok := score("order-43"); ok || rdb.HExists(ctx, k.Tasks(i43), "order-43").Val() ||
			rdb.HExists(ctx, k.Props(i43), "order-43").Val() {
			t.Fatalf("after the example: id order-43 (cancelled) is left: pending %v, %s %v, %s %v", ok,
				k.Tasks(i43), rdb.HExists(ctx, k.Tasks(i43), "order-43").Val(), k.Props(i43),
				rdb.HExists(ctx, k.Props(i43), "order-43").Val())
		}
		return s44
	}

	t.Run("python", func(t *testing.T) {
		requireClientPython(t)
		code := example(t, clientPython+"/README.md", "py")
		script := filepath.Join(t.TempDir(), "example.py")
		if err := os.WriteFile(script, []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
		pkg, err := filepath.Abs(clientPython)
		if err != nil {
			t.Fatal(err)
		}
		runIn(t, ".", []string{"PYTHONPATH=" + pkg}, nil, time.Minute, systemPython, script)
		check(t)
	})

	t.Run("node", func(t *testing.T) {
		ensureNodeModules(t)
		code := example(t, clientNode+"/README.md", "js")
		dir := t.TempDir()
		pkg, err := filepath.Abs(clientNode)
		if err != nil {
			t.Fatal(err)
		}
		// The example requires dispatcher-producer and ioredis by name.
		if err := os.MkdirAll(filepath.Join(dir, "nm"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(pkg, filepath.Join(dir, "nm", "dispatcher-producer")); err != nil {
			t.Fatal(err)
		}
		// Its await needs an async function; the open connection would keep
		// node running.
		wrapped := "(async () => {\n" + code + "})().then(() => process.exit(0), (err) => {\n" +
			"  console.error(err);\n  process.exit(1);\n});\n"
		if err := os.WriteFile(filepath.Join(dir, "example.js"), []byte(wrapped), 0o644); err != nil {
			t.Fatal(err)
		}
		out := runIn(t, dir, []string{"NODE_PATH=" + filepath.Join(dir, "nm") + ":" + filepath.Join(pkg, "node_modules")},
			nil, time.Minute, "node", "example.js")
		due := check(t)
		if want := shard.MessageID([]byte("order-42"), due+300_000); strings.TrimSpace(out) != want {
			t.Fatalf("the example printed %q, want the message id %s", out, want)
		}
	})
}

// clientPropertiesTable is the table of message properties that the
// dispatcher accepts or refuses, which the packages' own tests also read.
const clientPropertiesTable = "testdata/clients/properties.json"

// TestClientPropertiesTable: the dispatcher's own parsing
// (shard.ParseProperties) agrees with the table the Python and Node
// packages' tests check their client-side validation against, and each
// refusal names the field the table says.
func TestClientPropertiesTable(t *testing.T) {
	b, err := os.ReadFile(clientPropertiesTable)
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Cases []struct {
			Props json.RawMessage `json:"props"`
			OK    bool            `json:"ok"`
			Field string          `json:"field"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &table); err != nil {
		t.Fatalf("%s: %v", clientPropertiesTable, err)
	}
	if len(table.Cases) < 10 {
		t.Fatalf("%s has %d cases", clientPropertiesTable, len(table.Cases))
	}
	for _, c := range table.Cases {
		_, err := shard.ParseProperties(c.Props)
		switch {
		case c.OK && err != nil:
			t.Errorf("%s: the dispatcher refuses it: %v; the table says it is accepted", c.Props, err)
		case !c.OK && err == nil:
			t.Errorf("%s: the dispatcher accepts it; the table says it is refused (%s)", c.Props, c.Field)
		case !c.OK && !strings.Contains(err.Error(), c.Field):
			t.Errorf("%s: the dispatcher's error %q does not name %q", c.Props, err, c.Field)
		}
	}
}

// TestContractHeaderVectors: CONTRACT.md's header test vectors, each
// value written as JSON, read by the dispatcher (shard.ParseProperties)
// as the table says; the Go, Python and Node producers' own tests check
// the same vectors as values of their language.
func TestContractHeaderVectors(t *testing.T) {
	b, err := os.ReadFile("../CONTRACT.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- header-vectors:"
	_, table, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("CONTRACT.md has no %q table", marker)
	}
	code := regexp.MustCompile("`([^`]*)`")
	rows := 0
	for _, line := range strings.Split(table, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 3 || strings.HasPrefix(cells[0], " ---") || strings.HasPrefix(cells[0], " header name") {
			continue
		}
		rows++
		name := code.FindStringSubmatch(cells[0])
		value := code.FindStringSubmatch(cells[1])
		if name == nil || value == nil {
			t.Fatalf("CONTRACT.md: header vector %q: no `name` or `value`", line)
		}
		literal := value[1]
		if strings.HasPrefix(strings.TrimSpace(cells[1]), "string") {
			q, _ := json.Marshal(literal)
			literal = string(q)
		}
		in := fmt.Sprintf(`{"headers":{%s:%s}}`, strconv.Quote(name[1]), literal)
		p, err := shard.ParseProperties([]byte(in))
		want := strings.TrimSpace(cells[2])
		if strings.HasPrefix(want, "refused") {
			if err == nil {
				t.Errorf("CONTRACT.md says %s is refused; the dispatcher reads %+v", in, p.Headers)
			}
			continue
		}
		if err != nil {
			t.Errorf("CONTRACT.md says %s is stored as %s; the dispatcher refuses it: %v", in, want, err)
			continue
		}
		got, err := p.Marshal()
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if stored := code.FindStringSubmatch(want); stored == nil || string(got) != `{"headers":{`+stored[1]+`}}` {
			t.Errorf("CONTRACT.md says %s is stored as %s; the dispatcher stores %s", in, want, got)
		}
	}
	if rows < 10 {
		t.Fatalf("CONTRACT.md's header vectors: %d rows read", rows)
	}
}

// TestClientPythonInstallsWithoutWheel: the Python package installs with
// an interpreter whose environment has pip and setuptools but no `wheel`
// (a pyenv or python.org Python's fresh venv), offline, both as the
// README's line has it (--no-build-isolation) and with pip's default
// isolated build: neither may need anything from a package index.
func TestClientPythonInstallsWithoutWheel(t *testing.T) {
	t.Parallel()
	requireClientPython(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	runIn(t, ".", nil, nil, time.Minute, "cp", "-r", clientPython, src)
	for _, isolation := range []bool{false, true} {
		venv := filepath.Join(dir, fmt.Sprintf("venv-%v", isolation))
		// Its own site-packages only: pip and the setuptools ensurepip
		// brings, no wheel.
		runIn(t, dir, nil, nil, 2*time.Minute, systemPython, "-m", "venv", venv)
		py := filepath.Join(venv, "bin", "python")
		if out, err := exec.Command(py, "-c", "import wheel").CombinedOutput(); err == nil {
			t.Fatalf("the venv has wheel: the test proves nothing (%s)", out)
		}
		args := []string{"-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check"}
		if !isolation {
			args = append(args, "--no-build-isolation")
		}
		runIn(t, dir, nil, nil, 3*time.Minute, py, append(args, src)...)
		out := runIn(t, dir, nil, nil, time.Minute, py, "-c",
			"import importlib.metadata as m, pathlib; d = m.distribution('dispatcher-producer'); "+
				"print(d.version, any(str(f).endswith('dispatcher_producer/producer.py') for f in d.files))")
		if strings.TrimSpace(out) != "0.1.0 True" {
			t.Fatalf("isolation %v: installed %q, want version 0.1.0 with dispatcher_producer/producer.py", isolation, out)
		}
	}
}
