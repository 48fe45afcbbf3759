package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

const (
	examplePython = "../examples/python/producer.py"
	exampleJava   = "../examples/java/Consumer.java"
)

// exampleJars is the Java consumer's classpath, from Debian's packages.
var exampleJars = []string{
	"/usr/share/java/amqp-client.jar",  // librabbitmq-client-java
	"/usr/share/java/slf4j-api.jar",    // libslf4j-java, its dependency
	"/usr/share/java/slf4j-simple.jar", // libslf4j-java: the client's warnings to stderr
	"/usr/share/java/lz4-java.jar",     // liblz4-java: XXH64
}

// requireExampleTools fails the test, never skips it, when what the
// examples need is missing: scripts/dev.sh test installs all of it.
func requireExampleTools(t *testing.T) {
	t.Helper()
	var missing []string
	for _, tool := range []string{"java", "javac"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (a JDK: default-jdk-headless)")
		}
	}
	for _, jar := range exampleJars {
		if _, err := os.Stat(jar); err != nil {
			missing = append(missing, jar)
		}
	}
	if out, err := exec.Command(systemPython, "-c", "import redis, xxhash").CombinedOutput(); err != nil {
		missing = append(missing, fmt.Sprintf("%s modules redis and xxhash (%v: %s)", systemPython, err,
			strings.TrimSpace(string(out))))
	}
	if len(missing) > 0 {
		t.Fatalf("the examples cannot run, missing:\n  %s\nrun scripts/dev.sh test, which installs python3-redis, "+
			"python3-xxhash, librabbitmq-client-java, liblz4-java and default-jdk-headless",
			strings.Join(missing, "\n  "))
	}
}

// runExample runs a command to its end and returns its standard output.
func runExample(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t.Logf("running %s", strings.Join(cmd.Args, " "))
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(cmd.Args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// exampleTask is one line that producer.py prints; ID and Body for a task
// scheduled by id (Member is then the id), Op and Result for --cancel-id and
// --reschedule-id.
type exampleTask struct {
	ID        string `json:"id"`
	Body      string `json:"body"`
	Op        string `json:"op"`
	Result    *bool  `json:"result"`
	Member    string `json:"member"`
	Key       string `json:"key"`
	Shard     int    `json:"shard"`
	DueMs     int64  `json:"due_ms"`
	MessageID string `json:"message_id"`
	// Traceparent is the header the test gave it (producer.py does not print it).
	Traceparent string `json:"-"`
}

// body is the message body the task's message carries.
func (task exampleTask) body() string {
	if task.ID != "" {
		return task.Body
	}
	return task.Member
}

// The task the examples schedule by id, with a W3C trace context.
const (
	exampleTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	exampleTraceparent = "00-" + exampleTraceID + "-00f067aa0ba902b7-01"
)

// TestPythonProducerJavaConsumer runs the examples end to end against
// the real servers and a dispatcher: examples/python/producer.py schedules
// 200 tasks (some due at once and woken, most 1.5 s ahead) and, by id,
// one with a traceparent header, one it then cancels and one it then
// reschedules; examples/java/Consumer.java, with the RabbitMQ Java client,
// must do every task exactly once, acking after its work, and print the
// task id and trace id of the ones by id (the producer's); a copy of a
// delivered message, published by the test with the same message_id, must
// be dropped as a duplicate. Both first check the contract's test vectors.
func TestPythonProducerJavaConsumer(t *testing.T) {
	requireExampleTools(t)
	began := time.Now()
	classpath := strings.Join(exampleJars, ":")

	// Self-checks: the contract's XXH64 test vectors, in both libraries.
	if out := runExample(t, 30*time.Second, systemPython, examplePython, "--check-vectors"); !strings.Contains(out, "5 ok") {
		t.Fatalf("producer.py --check-vectors printed %q", out)
	}
	classes := t.TempDir()
	runExample(t, time.Minute, "javac", "-Xlint:all", "-Werror", "-cp", classpath, "-d", classes, exampleJava)
	javaCP := classes + ":" + classpath
	if out := runExample(t, 30*time.Second, "java", "-cp", javaCP, "Consumer", "--check-vectors"); !strings.Contains(out, "5 ok") {
		t.Fatalf("Consumer --check-vectors printed %q", out)
	}

	const shards = 8
	h := newHarness(t, queueSpec{Name: "examples", Shards: shards})
	exchange, routingKey := h.prefix+".examples", "examples"
	// The consumer's own queue, durable so that it outlives the consumer
	// and the acks can be checked after it exits.
	queue := h.prefix + ".java-consumer"
	t.Cleanup(func() {
		if ch, err := h.conn.Channel(); err == nil {
			ch.QueueDelete(queue, false, false, false)
			ch.Close()
		}
	})

	// The consumer first, so that its queue is bound before anything is due.
	const total = 202 // 200 plain, 2 by id (one more is cancelled)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	consumer := exec.CommandContext(ctx, "java", "-cp", javaCP, "Consumer", testenv.AMQPURL(t), exchange, routingKey,
		queue, "--durable", "--expect", fmt.Sprint(total), "--quiet-ms", "1500", "--timeout", "40")
	t.Logf("running %s", strings.Join(consumer.Args, " "))
	stdout, err := consumer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	consumer.Stderr = stderr
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 10000)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	exited := false
	var exitErr error
	waitConsumer := func() {
		<-readDone // all output read before Wait closes the pipe
		exitErr, exited = consumer.Wait(), true
	}
	t.Cleanup(func() {
		if !exited {
			consumer.Process.Kill()
			waitConsumer()
		}
	})
	var output []string
	next := func(timeout time.Duration) (string, bool) {
		select {
		case l, ok := <-lines:
			if ok {
				output = append(output, l)
			}
			return l, ok
		case <-time.After(timeout):
			t.Fatalf("the Java consumer printed nothing for %s; output:\n%s\nstderr:\n%s", timeout,
				strings.Join(output, "\n"), stderr.String())
			return "", false
		}
	}
	if l, ok := next(30 * time.Second); !ok || !strings.HasPrefix(l, "ready") {
		t.Fatalf("the Java consumer did not start: %q\nstderr:\n%s", l, stderr.String())
	}

	h.start()
	produce := func(args ...string) map[string]exampleTask {
		t.Helper()
		base := []string{examplePython, "--redis", testenv.RedisURL(t), "--prefix", h.prefix, "--queue", "examples",
			"--shards", fmt.Sprint(shards)}
		out := runExample(t, 30*time.Second, systemPython, append(base, args...)...)
		tasks := map[string]exampleTask{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var task exampleTask
			if err := json.Unmarshal([]byte(l), &task); err != nil {
				t.Fatalf("producer.py printed %q: %v", l, err)
			}
			tasks[task.MessageID] = task
		}
		return tasks
	}
	// one runs producer.py for one task and returns what it printed.
	one := func(args ...string) exampleTask {
		t.Helper()
		tasks := produce(args...)
		if len(tasks) != 1 {
			t.Fatalf("producer.py %v printed %d tasks, want 1: %v", args, len(tasks), tasks)
		}
		for _, task := range tasks {
			return task
		}
		panic("unreachable")
	}
	// Due at once and woken; two given bodies a second ahead, woken too
	// when the second is not yet over; the rest 1.5 s ahead, found by the
	// sweeps.
	want := produce("--in", "0", "--wake", "--count", "48", "--tag", "now")
	for id, task := range produce("--in", "1", "--wake", "задача", `{"id":1}`) {
		want[id] = task
	}
	for id, task := range produce("--in", "1.5", "--count", "150", "--tag", "later") {
		want[id] = task
	}
	// By id: one with a trace context; one cancelled (due 2.5 s ahead: time
	// for the cancel to find it pending, and before the moved one, which
	// runs after it and is due 1.5 s after that, so that the consumer is
	// still collecting when it came had the cancel failed); one moved from
	// an hour ahead.
	traced := one("--in", "1.2", "--id", "examples-order-7", "--header", "traceparent="+exampleTraceparent,
		`{"order":7}`)
	traced.Traceparent = exampleTraceparent
	want[traced.MessageID] = traced
	cancelled := one("--in", "2.5", "--id", "examples-cancelled", "cancelled body")
	if r := one("--cancel-id", "examples-cancelled"); r.Op != "cancel" || r.Result == nil || !*r.Result {
		t.Fatalf("producer.py --cancel-id printed %+v, want cancelled", r)
	}
	hour := one("--in", "3600", "--id", "examples-moved", "moved body")
	moved := one("--reschedule-id", "examples-moved", "--in", "1.5")
	if moved.Op != "reschedule" || moved.Result == nil || !*moved.Result {
		t.Fatalf("producer.py --reschedule-id printed %+v, want rescheduled", moved)
	}
	moved.Member, moved.Body = moved.ID, hour.Body
	want[moved.MessageID] = moved
	if len(want) != total {
		t.Fatalf("producer.py printed %d distinct message ids, want %d", len(want), total)
	}
	// Python's shard choice and message ids are the Go package's.
	for id, task := range want {
		i := shard.Index([]byte(task.Member), shards)
		placed := task.Op != "" || task.Shard == i && task.Key == fmt.Sprintf("%s:{examples:%d}", h.prefix, i)
		if !placed || id != shard.MessageID([]byte(task.Member), task.DueMs) {
			t.Fatalf("producer.py printed %+v; package shard says shard %d, message id %s", task, i,
				shard.MessageID([]byte(task.Member), task.DueMs))
		}
	}

	// Read the consumer to its end; copy the first task it did, same
	// message_id and all, straight into the exchange.
	delivered := map[string]int{}
	bodies, taskIDs, traceIDs := map[string]string{}, map[string]string{}, map[string]string{}
	var dropped []string
	var summary, injected string
	for {
		l, ok := next(45 * time.Second)
		if !ok {
			break
		}
		switch f := strings.Fields(l); {
		case strings.HasPrefix(l, "task-id ") && len(f) >= 2:
			taskIDs[f[1]] = strings.TrimPrefix(l, "task-id "+f[1]+" ")
		case strings.HasPrefix(l, "trace-id ") && len(f) >= 2:
			traceIDs[f[1]] = strings.TrimPrefix(l, "trace-id "+f[1]+" ")
		case strings.HasPrefix(l, "delivered ") && len(f) >= 2:
			delivered[f[1]]++
			bodies[f[1]] = strings.TrimPrefix(l, "delivered "+f[1]+" ")
			if injected == "" {
				injected = f[1]
				publishCopy(t, h.conn, exchange, routingKey, want[injected])
			}
		case strings.HasPrefix(l, "duplicate ") && len(f) >= 2:
			dropped = append(dropped, f[1])
		case strings.HasPrefix(l, "summary: "):
			summary = l
		}
	}
	waitConsumer()
	if exitErr != nil {
		t.Fatalf("the Java consumer failed: %v\noutput:\n%s\nstderr:\n%s", exitErr,
			tail(strings.Join(output, "\n"), 3000), stderr.String())
	}

	var lost, extra []string
	for id := range want {
		if delivered[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id, n := range delivered {
		if _, ok := want[id]; !ok || n > 1 {
			extra = append(extra, fmt.Sprintf("%s (%d times)", id, n))
		}
	}
	sort.Strings(lost)
	sort.Strings(extra)
	if len(lost) > 0 || len(extra) > 0 {
		t.Errorf("the Java consumer did %d tasks: %d of %d scheduled missing %v; unexpected or done twice: %v",
			len(delivered), len(lost), total, lost, extra)
	}
	if delivered[cancelled.MessageID] > 0 || delivered[hour.MessageID] > 0 {
		t.Errorf("the task cancelled by id (%d times) or the one rescheduled by id at its old due time (%d times) "+
			"was delivered", delivered[cancelled.MessageID], delivered[hour.MessageID])
	}
	// Tasks by id: their body, id and trace context, as producer.py gave them.
	for id, task := range want {
		wantID, wantTrace := "", ""
		if task.ID != "" {
			wantID = task.ID
		}
		if task.MessageID == traced.MessageID {
			wantTrace = exampleTraceID
		}
		if delivered[id] > 0 && (bodies[id] != task.body() || taskIDs[id] != wantID || traceIDs[id] != wantTrace) {
			t.Errorf("the Java consumer did %s with body %q, task id %q, trace id %q; want %q, %q, %q", id, bodies[id],
				taskIDs[id], traceIDs[id], task.body(), wantID, wantTrace)
		}
	}
	if len(dropped) != 1 || dropped[0] != injected {
		t.Errorf("the Java consumer dropped duplicates %v, want exactly the copy of %s", dropped, injected)
	}
	if want := fmt.Sprintf("summary: delivered %d, duplicates dropped 1, rejected 0", total); summary != want {
		t.Errorf("the Java consumer's summary is %q, want %q", summary, want)
	}
	// Every message, the copy too, was acked: none went back to the queue
	// when the consumer closed its channel.
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("%d messages left in %s: the consumer did not ack them", q.Messages, queue)
	}
	t.Logf("Python producer -> dispatcher -> Java consumer: %d tasks, 1 duplicate dropped, in %v (with compiling)",
		len(delivered), time.Since(began).Round(100*time.Millisecond))

	javaConsumerQueueGoesWithIt(t, h, javaCP, exchange, routingKey, traced)
}

// javaConsumerQueueGoesWithIt: without --durable, the Java consumer's
// queue lives only as long as the consumer, so that no queue is left bound
// to the exchange collecting tasks that no one reads. The task, a copy of
// the traced one by id as the contract makes its message, also shows the
// consumer's lines for its id and trace id.
func javaConsumerQueueGoesWithIt(t *testing.T, h *harness, javaCP, exchange, routingKey string, task exampleTask) {
	t.Helper()
	queue := h.prefix + ".java-exclusive"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	consumer := exec.CommandContext(ctx, "java", "-cp", javaCP, "Consumer", testenv.AMQPURL(t), exchange, routingKey,
		queue, "--expect", "1", "--quiet-ms", "200", "--timeout", "40")
	stdout, err := consumer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	consumer.Stderr = stderr
	if err := consumer.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "ready") || !strings.Contains(sc.Text(), "exclusive") {
		consumer.Process.Kill()
		consumer.Wait()
		t.Fatalf("the Java consumer without --durable started with %q\nstderr:\n%s", sc.Text(), stderr.String())
	}
	publishCopy(t, h.conn, exchange, routingKey, task)
	var rest []string
	for sc.Scan() {
		rest = append(rest, sc.Text())
	}
	if err := consumer.Wait(); err != nil {
		t.Fatalf("the Java consumer without --durable: %v\noutput:\n%s\nstderr:\n%s", err, strings.Join(rest, "\n"), stderr.String())
	}
	wantLines := []string{"delivered " + task.MessageID + " " + task.body(), "task-id " + task.MessageID + " " + task.ID,
		"trace-id " + task.MessageID + " " + exampleTraceID}
	if len(rest) < 3 || fmt.Sprint(rest[:3]) != fmt.Sprint(wantLines) {
		t.Fatalf("the Java consumer without --durable printed %q, want first %q", rest, wantLines)
	}
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if q, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil); err == nil {
		ch.QueueDelete(queue, false, false, false)
		t.Fatalf("the queue %s of a consumer without --durable is still there after it stopped (%d messages)", queue, q.Messages)
	} else if !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("declare %s passively: %v, want NOT_FOUND", queue, err)
	}
}

// publishCopy publishes, as a second delivery of one scheduling would
// arrive, a message like the dispatcher's for task.
func publishCopy(t *testing.T, conn *amqp.Connection, exchange, key string, task exampleTask) {
	t.Helper()
	if task.MessageID == "" {
		t.Fatal("the Java consumer did a task that producer.py did not schedule")
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	headers := amqp.Table{"x-due-ms": task.DueMs}
	if task.ID != "" {
		headers["x-task-id"] = task.ID
	}
	if task.Traceparent != "" {
		headers["traceparent"] = task.Traceparent
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp.Publishing{
		Body:         []byte(task.body()),
		MessageId:    task.MessageID,
		DeliveryMode: amqp.Persistent,
		Headers:      headers,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("the broker did not confirm the copy of %s: %v", task.MessageID, err)
	}
}

// fence matches a fenced code block's opening line and captures its language.
var fence = regexp.MustCompile("(?m)^```([A-Za-z0-9_+-]*)[ \t]*$")

// TestDocSnippetsAreExamples: a snippet in another language than Go in the
// README or docs/producers.md is an excerpt, word for word, of an example
// that the tests run: examples/ (TestPythonProducerJavaConsumer), or the
// producer packages' README examples (TestClientREADMEExamples), fenced py
// and js there; shell commands and plain text (a diagram) are allowed, any
// other language is not.
func TestDocSnippetsAreExamples(t *testing.T) {
	examples := map[string]string{"python": examplePython, "java": exampleJava,
		"py": clientPython + "/README.md", "js": clientNode + "/README.md"}
	sources := map[string]string{}
	for lang, path := range examples {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sources[lang] = string(b)
		if strings.HasSuffix(path, "README.md") {
			sources[lang] = fencedBlocks(t, path, lang) // its example's code, not its prose
		}
	}
	checked := 0
	for _, doc := range []string{"../README.md", "../docs/producers.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for {
			m := fence.FindStringSubmatchIndex(text)
			if m == nil {
				break
			}
			lang := text[m[2]:m[3]]
			body := text[m[1]:]
			body = strings.TrimPrefix(body, "\n")
			end := strings.Index(body, "\n```")
			if end < 0 {
				t.Fatalf("%s: a %q code block is not closed", doc, lang)
			}
			snippet := body[:end+1]
			text = body[end+len("\n```"):]
			switch lang {
			case "go", "sh", "":
			case "python", "java", "py", "js":
				checked++
				if !strings.Contains(sources[lang], snippet) {
					t.Errorf("%s: this %s snippet is not word for word in %s, which the tests run:\n%s",
						doc, lang, examples[lang], snippet)
				}
			default:
				t.Errorf("%s: a %q snippet: nothing compiles or runs it; make it an excerpt of an example "+
					"under examples/ checked here, or remove it", doc, lang)
			}
		}
	}
	t.Logf("%d Python, Java and JavaScript snippets are excerpts of the examples", checked)
}
