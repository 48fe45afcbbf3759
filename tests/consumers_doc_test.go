package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

const (
	consumersDoc = "../docs/consumers.md"
	// sqliteJar is the JDBC driver the Java snippet runs with here
	// (Debian: libxerial-sqlite-jdbc-java); the snippet is plain JDBC.
	sqliteJar = "/usr/share/java/sqlite-jdbc.jar"
)

// docBlock returns the only fenced block of language lang in doc.
func docBlock(t *testing.T, doc, lang string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?ms)^```"+lang+"\n(.*?)^```$").FindAllStringSubmatch(string(b), -1)
	if len(blocks) != 1 {
		t.Fatalf("%s has %d %s blocks, want 1", doc, len(blocks), lang)
	}
	return blocks[0][1]
}

// rename replaces each old string of the snippet with its new one, and
// fails if one is not there: the test runs the snippet as written, only
// with this test's names and servers.
func rename(t *testing.T, snippet string, pairs ...string) string {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(snippet, pairs[i]) {
			t.Fatalf("the snippet no longer contains %s:\n%s", pairs[i], snippet)
		}
		snippet = strings.ReplaceAll(snippet, pairs[i], pairs[i+1])
	}
	return snippet
}

// consumerNames are one run's exchange and queues, in place of the
// snippets' "tasks", "orders" and "orders.dead".
type consumerNames struct{ exchange, queue, dead string }

func newConsumerNames(t *testing.T) consumerNames {
	base := testenv.Name(t)
	return consumerNames{exchange: base + ".tasks", queue: base + ".orders", dead: base + ".orders.dead"}
}

func (n consumerNames) pairs() []string {
	return []string{`"orders.dead"`, `"` + n.dead + `"`, `"orders"`, `"` + n.queue + `"`, `"tasks"`, `"` + n.exchange + `"`}
}

// brokerQueue reads a queue's state on a channel of its own (a passive
// declaration of a missing queue closes its channel); ok false if missing.
func brokerQueue(t *testing.T, conn *amqp.Connection, name string) (amqp.Queue, bool) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return q, err == nil
}

// runConsumerDoc runs a consumer of docs/consumers.md (start starts one
// process, printing "work BODY" per task it works on; bodies starting with
// "fail" fail) through a crash and a restart:
//   - tasks a, b and fail published as the dispatcher publishes them: a and b
//     worked on once; fail nacked, delivered 1 + x-delivery-limit (5) times,
//     then in the dead-letter queue;
//   - the consumer SIGKILLed and started again, then a copy of a (same
//     message_id, as a dispatcher's duplicate) and a new task c: c worked on,
//     the copy of a dropped, nothing left in the queue.
//
// done, if not nil, tells that c's work was committed: the consumer prints
// "work c" before its commit and its ack, and the queue's ready count is 0
// as soon as c is delivered, so without it the second SIGKILL could come
// between the print and the commit (it did, once, on a loaded machine).
func runConsumerDoc(t *testing.T, names consumerNames, start func() (*exec.Cmd, *syncBuffer), done func() bool) {
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			ch.QueueDelete(names.queue, false, false, false)
			ch.QueueDelete(names.dead, false, false, false)
			ch.ExchangeDelete(names.exchange, false, false)
			ch.ExchangeDelete(names.dead, false, false)
			ch.Close()
		}
		conn.Close()
	})
	due := time.Now().UnixMilli()
	task := func(body string) exampleTask {
		return exampleTask{Member: body, DueMs: due, MessageID: shard.MessageID([]byte(body), due)}
	}
	ready := func(what string) {
		eventually(t, 90*time.Second, what, func() bool {
			q, ok := brokerQueue(t, conn, names.queue)
			return ok && q.Consumers > 0
		})
	}
	stop := func(cmd *exec.Cmd) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	works := func(out, body string) int {
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if l == "work "+body {
				n++
			}
		}
		return n
	}

	first, out1 := start()
	t.Cleanup(func() { stop(first) })
	ready("the consumer to declare its queue and consume")
	for _, body := range []string{"a", "b", "fail-1"} {
		publishCopy(t, conn, names.exchange, names.queue, task(body))
	}
	eventually(t, 60*time.Second, "a and b done, fail-1 dead-lettered", func() bool {
		q, ok := brokerQueue(t, conn, names.dead)
		return works(out1.String(), "a") > 0 && works(out1.String(), "b") > 0 && ok && q.Messages == 1
	})
	stop(first) // a crash: no clean close; Wait has read all its output
	if n := works(out1.String(), "fail-1"); n != 6 {
		t.Errorf("fail-1 worked on %d times, want 6 (the first delivery and x-delivery-limit 5 more)\n%s", n, out1.String())
	}

	second, out2 := start()
	t.Cleanup(func() { stop(second) })
	ready("the restarted consumer")
	publishCopy(t, conn, names.exchange, names.queue, task("a"))
	publishCopy(t, conn, names.exchange, names.queue, task("c"))
	eventually(t, 60*time.Second, "c done and the queue empty", func() bool {
		q, ok := brokerQueue(t, conn, names.queue)
		return works(out2.String(), "c") > 0 && ok && q.Messages == 0 && (done == nil || done())
	})
	stop(second)
	if n := works(out1.String(), "a") + works(out2.String(), "a"); n != 1 {
		t.Errorf("a worked on %d times, want once: its copy after the restart must be dropped\nfirst run:\n%s\nsecond run:\n%s",
			n, out1.String(), out2.String())
	}
	if n := works(out1.String(), "b"); n != 1 {
		t.Errorf("b worked on %d times, want once\n%s", n, out1.String())
	}
	t.Logf("first run:\n%ssecond run:\n%s", out1.String(), out2.String())
}

// startProcess starts a consumer process whose output is collected.
func startProcess(t *testing.T, name string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(name, args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// TestConsumersDocPython runs docs/consumers.md's Python consumer (pika,
// redis-py) as written, with this test's names and servers: see
// runConsumerDoc. Its marks in Redis survive the restart.
func TestConsumersDocPython(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	if out, err := exec.Command(systemPython, "-c", "import pika, redis").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import pika and redis (%v: %s): run scripts/dev.sh test, which installs python3-pika",
			systemPython, err, strings.TrimSpace(string(out)))
	}
	names := newConsumerNames(t)
	snippet := rename(t, docBlock(t, consumersDoc, "python"), append(names.pairs(),
		`"redis://localhost:6379/0"`, fmt.Sprintf("%q", testenv.RedisURL(t)),
		`"amqp://guest:guest@localhost:5672/"`, fmt.Sprintf("%q", testenv.AMQPURL(t)))...)
	dir := t.TempDir()
	script := filepath.Join(dir, "consumer.py")
	// The snippet calls work(body), which the reader writes: here it prints
	// the body and fails for bodies starting with "fail".
	runner := "import sys\n\n\ndef work(body):\n    print(\"work\", body.decode(), flush=True)\n" +
		"    if body.startswith(b\"fail\"):\n        raise RuntimeError(\"the work failed\")\n\n\n" + snippet
	if err := os.WriteFile(script, []byte(runner), 0o644); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	t.Cleanup(func() {
		var marks []string
		for _, body := range []string{"a", "b", "c", "fail-1"} {
			// Any due time: the test's marks are found by scanning for their hash.
			h := shard.MessageID([]byte(body), 0)
			keys, _ := rdb.Keys(context.Background(), "done:"+strings.TrimSuffix(h, "-0")+"-*").Result()
			marks = append(marks, keys...)
		}
		if len(marks) > 0 {
			rdb.Del(context.Background(), marks...)
		}
	})
	runConsumerDoc(t, names, func() (*exec.Cmd, *syncBuffer) {
		return startProcess(t, systemPython, "-u", script)
	}, nil)
}

// consumerHarness wraps the Java snippet's declare and handle in a class
// whose work(db, body) writes the body to table work_log and fails for
// bodies starting with "fail" (after its write: the rollback must undo it).
const consumerHarness = `import com.rabbitmq.client.*;
import java.io.IOException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.Map;
import javax.sql.DataSource;
import org.sqlite.SQLiteDataSource;

public final class ConsumerDoc {
    static void work(Connection db, byte[] body) throws SQLException {
        String b = new String(body, java.nio.charset.StandardCharsets.UTF_8);
        try (PreparedStatement p = db.prepareStatement("INSERT INTO work_log (body) VALUES (?)")) {
            p.setString(1, b);
            p.executeUpdate();
        }
        System.out.println("work " + b);
        if (b.startsWith("fail")) {
            throw new IllegalStateException("the work failed");
        }
    }

%s
    public static void main(String[] args) throws Exception {
        SQLiteDataSource pool = new SQLiteDataSource();
        pool.setUrl("jdbc:sqlite:" + args[1]);
        try (Connection db = pool.getConnection(); java.sql.Statement s = db.createStatement()) {
            s.execute("CREATE TABLE IF NOT EXISTS processed (message_id VARCHAR(64) PRIMARY KEY, done_at TIMESTAMP NOT NULL)");
            s.execute("CREATE TABLE IF NOT EXISTS work_log (body TEXT)");
        }
        ConnectionFactory f = new ConnectionFactory();
        f.setUri(args[0]);
        if (f.getVirtualHost().isEmpty()) {
            f.setVirtualHost("/");
        }
        com.rabbitmq.client.Connection conn = f.newConnection("consumers-doc");
        Channel ch = conn.createChannel();
        declare(ch);
        ch.basicConsume(args[2], false, (tag, d) -> handle(ch, d, pool), tag -> { });
        Thread.sleep(Long.MAX_VALUE);
    }
}
`

// TestConsumersDocJava compiles docs/consumers.md's Java consumer (the
// RabbitMQ Java client, JDBC) as written into a class, runs it on SQLite
// with this test's names (see runConsumerDoc), and checks the database:
// one mark and one work row per task done, the failed task's work rolled
// back every time.
func TestConsumersDocJava(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	requireExampleTools(t)
	if _, err := os.Stat(sqliteJar); err != nil {
		t.Fatalf("%v: run scripts/dev.sh test, which installs libxerial-sqlite-jdbc-java", err)
	}
	names := newConsumerNames(t)
	snippet := rename(t, docBlock(t, consumersDoc, "java"), names.pairs()...)
	var indented strings.Builder
	for _, l := range strings.Split(strings.TrimRight(snippet, "\n"), "\n") {
		if l != "" {
			indented.WriteString("    " + l)
		}
		indented.WriteString("\n")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "ConsumerDoc.java")
	if err := os.WriteFile(src, []byte(fmt.Sprintf(consumerHarness, indented.String())), 0o644); err != nil {
		t.Fatal(err)
	}
	classpath := strings.Join(append(exampleJars[:len(exampleJars):len(exampleJars)], sqliteJar), ":")
	runExample(t, time.Minute, "javac", "-Xlint:all", "-Werror", "-cp", classpath, "-d", dir, src)
	db := filepath.Join(dir, "consumer.sqlite")
	const query = `import sqlite3, sys
d = sqlite3.connect(sys.argv[1])
print(sorted(r[0] for r in d.execute("SELECT body FROM work_log")))
print(d.execute("SELECT COUNT(*) FROM processed").fetchone()[0])`
	runConsumerDoc(t, names, func() (*exec.Cmd, *syncBuffer) {
		return startProcess(t, "java", "-cp", dir+":"+classpath, "ConsumerDoc", testenv.AMQPURL(t), db, names.queue)
	}, func() bool {
		out, err := exec.Command(systemPython, "-c", query, db).Output()
		return err == nil && strings.Contains(string(out), "'c'")
	})

	rows := runExample(t, 30*time.Second, systemPython, "-c", query, db)
	if want := "['a', 'b', 'c']\n3\n"; rows != want {
		t.Errorf("the database holds work %q, want %q: each task's work once, the failed one's rolled back", rows, want)
	}
}
