package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// The producers of docs/migrating-from-delayed-plugin.md, written as users
// of the delayed-message plugin write them, one per client; the page's
// snippets are excerpts of them (TestMigrationDocSnippetsAreExamples).
const (
	migrationDoc         = "../docs/migrating-from-delayed-plugin.md"
	ingressJavaProducer  = "../examples/ingress/java/DelayedProducer.java"
	ingressNodeDir       = "../examples/ingress/node"
	ingressNodeProducer  = ingressNodeDir + "/producer.js"
	ingressPythonProduce = "../examples/ingress/python/producer.py"
)

// ingressJars is the Java producer's classpath, from Debian's packages.
var ingressJars = []string{
	"/usr/share/java/amqp-client.jar",  // librabbitmq-client-java
	"/usr/share/java/slf4j-api.jar",    // libslf4j-java, its dependency
	"/usr/share/java/slf4j-simple.jar", // libslf4j-java: the client's warnings to stderr
}

// ingressOrder is one message a producer of examples/ingress publishes, as
// a consumer of the queue's exchange must receive it.
type ingressOrder struct {
	id, key string
	delay   int64      // ms
	headers amqp.Table // every header the producer sent, x-delay included, with the type its client gives it
}

// ingressOrders are the three orders every producer of examples/ingress
// publishes: order-N with body {"order":"order-N"}, the same properties,
// the given routing keys and delays, and headers: common ones plus x-delay
// (typed by delayType) and the client's own.
func ingressOrders(delays []int64, delayType func(int64) any, common func() amqp.Table) []ingressOrder {
	keys := []string{"orders.created", "orders.paid", "orders.created"}
	var out []ingressOrder
	for n, d := range delays {
		h := common()
		h["x-delay"] = delayType(d)
		out = append(out, ingressOrder{id: fmt.Sprintf("order-%d", n), key: keys[n], delay: d, headers: h})
	}
	return out
}

// ingressCommonHeaders are the headers all three producers send, with the
// types every client gives them.
func ingressCommonHeaders() amqp.Table {
	return amqp.Table{
		"tenant":    "acme",
		"customer":  int64(4_000_000_000),
		"gift":      true,
		"amount":    amqp.Decimal{Scale: 2, Value: 1999},
		"placed":    time.Unix(1767225600, 0),
		"signature": []byte{0, 1, 254},
		"tags":      []any{"new", "eu"},
	}
}

// dispatcherHeaders are the headers the dispatcher adds to the producer's
// (docs/consumers.md), and the broker's receive time where it adds one.
var dispatcherHeaders = map[string]bool{"x-task-id": true, "x-due-ms": true, "x-dispatcher-seq": true,
	"x-published-us": true, "timestamp_in_ms": true}

// runIngressProducer runs a producer of examples/ingress against a
// dispatcher with the ingress on, and checks what a consumer bound to the
// queue's exchange with the producer's routing keys receives: each order
// once or more, with its routing key, body, properties and headers (each of
// its AMQP type), x-task-id and message_id its id, x-due-ms no earlier than
// the publish plus x-delay, and received no earlier than x-due-ms.
func runIngressProducer(t *testing.T, want []ingressOrder, producer func(amqpURL, exchange string) string) {
	t.Helper()
	w := newIngressWorld(t, []string{"orders.created", "orders.paid"}, nil)
	before := w.h.redisNow().UnixMilli()
	out := producer(testenv.AMQPURL(t), w.e)
	for _, o := range want {
		if line := fmt.Sprintf("published %s %s %d", o.id, o.key, o.delay); !strings.Contains(out, line+"\n") {
			t.Fatalf("the producer did not print %q:\n%s", line, out)
		}
	}
	got := w.receive(t, len(want), 30*time.Second)
	byID := map[string]received{}
	for _, r := range got {
		id, _ := r.d.Headers["x-task-id"].(string)
		if _, dup := byID[id]; !dup {
			byID[id] = r
		}
	}
	if len(got) > len(want) {
		t.Logf("%d deliveries for %d orders (at least once)", len(got), len(want))
	}
	for _, o := range want {
		r, ok := byID[o.id]
		if !ok {
			t.Errorf("%s: not delivered with x-task-id = its message_id; delivered: %v", o.id, byID)
			continue
		}
		d := r.d
		if body := fmt.Sprintf(`{"order":%q}`, o.id); string(d.Body) != body || d.RoutingKey != o.key || d.MessageId != o.id {
			t.Errorf("%s: body %q routing key %q message_id %q, want %q %q %q", o.id, d.Body, d.RoutingKey, d.MessageId, body, o.key, o.id)
		}
		if d.ContentType != "application/json" || d.ContentEncoding != "utf-8" || d.CorrelationId != "corr-"+o.id ||
			d.ReplyTo != "orders.replies" || d.Type != "order" || d.Priority != 3 || d.Expiration != "600000" ||
			d.DeliveryMode != amqp.Persistent {
			t.Errorf("%s: properties content_type %q content_encoding %q correlation_id %q reply_to %q type %q priority %d "+
				"expiration %q delivery_mode %d, want those the producer set", o.id, d.ContentType, d.ContentEncoding,
				d.CorrelationId, d.ReplyTo, d.Type, d.Priority, d.Expiration, d.DeliveryMode)
		}
		for k, v := range o.headers {
			if tv, ok := v.(time.Time); ok { // a timestamp: by instant
				if g, ok := d.Headers[k].(time.Time); !ok || !g.Equal(tv) {
					t.Errorf("%s: header %s = %v (%T), want %v", o.id, k, d.Headers[k], d.Headers[k], v)
				}
				continue
			}
			if g, ok := d.Headers[k]; !ok || !reflect.DeepEqual(g, v) {
				t.Errorf("%s: header %s = %#v (%T), want %#v (%T)", o.id, k, d.Headers[k], d.Headers[k], v, v)
			}
		}
		for k := range d.Headers {
			if _, sent := o.headers[k]; !sent && !dispatcherHeaders[k] {
				t.Errorf("%s: header %s = %#v, which the producer did not send", o.id, k, d.Headers[k])
			}
		}
		due, ok := d.Headers["x-due-ms"].(int64)
		if !ok {
			t.Errorf("%s: no x-due-ms: %v", o.id, d.Headers)
			continue
		}
		if due < before+o.delay {
			t.Errorf("%s: due at %d, before the producer started (%d) + x-delay %d", o.id, due, before, o.delay)
		}
		if r.at.UnixMilli() < due-2 { // one machine's clocks; 2 ms for rounding, as in TestIngressGoProducer
			t.Errorf("%s: received at %d, before its due time %d", o.id, r.at.UnixMilli(), due)
		}
	}
}

// TestIngressJavaProducer: examples/ingress/java/DelayedProducer.java, with
// the RabbitMQ Java client (x-delay an Integer; headers Short, Byte, Long,
// Boolean, Double, Float, BigDecimal, Date, byte[], List and Map), publishes
// to the ingress; the consumer gets each order as it was sent.
func TestIngressJavaProducer(t *testing.T) {
	var missing []string
	for _, tool := range []string{"java", "javac"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (a JDK: default-jdk-headless)")
		}
	}
	for _, jar := range ingressJars {
		if _, err := os.Stat(jar); err != nil {
			missing = append(missing, jar)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the Java producer cannot run, missing:\n  %s\nrun scripts/dev.sh test, which installs "+
			"librabbitmq-client-java and default-jdk-headless", strings.Join(missing, "\n  "))
	}
	classpath := strings.Join(ingressJars, ":")
	classes := t.TempDir()
	runExample(t, time.Minute, "javac", "-Xlint:all", "-Werror", "-cp", classpath, "-d", classes, ingressJavaProducer)
	want := ingressOrders([]int64{1500, 800, 0}, func(d int64) any { return int32(d) }, func() amqp.Table {
		h := ingressCommonHeaders()
		h["attempt"] = int16(1)
		h["region"] = int8(7)
		h["weight"] = 1.25
		h["ratio"] = float32(0.5)
		h["meta"] = amqp.Table{"source": "web", "version": int32(3)}
		return h
	})
	runIngressProducer(t, want, func(url, exchange string) string {
		return runExample(t, time.Minute, "java", "-cp", classes+":"+classpath, "DelayedProducer", url, exchange)
	})
}

// TestIngressNodeProducer: examples/ingress/node/producer.js, with amqplib
// from npm (a whole number goes as the smallest integer type that holds it:
// x-delay 1500 an int16, 100 and 0 an int8; 4,000,000,000 an int64),
// publishes to the ingress; the consumer gets each order as it was sent.
// scripts/dev.sh test installs its node_modules (npm ci).
func TestIngressNodeProducer(t *testing.T) {
	requireNode(t)
	if _, err := os.Stat(filepath.Join(ingressNodeDir, "node_modules", "amqplib", "package.json")); err != nil {
		t.Fatalf("amqplib is not installed in %s (%v): run scripts/dev.sh test, which runs npm ci there", ingressNodeDir, err)
	}
	want := ingressOrders([]int64{1500, 100, 0}, func(d int64) any {
		if d >= -128 && d < 128 {
			return int8(d)
		}
		return int16(d)
	}, func() amqp.Table {
		h := ingressCommonHeaders()
		h["weight"] = 1.25
		h["meta"] = amqp.Table{"source": "web", "version": int8(3)}
		return h
	})
	runIngressProducer(t, want, func(url, exchange string) string {
		return runIn(t, ingressNodeDir, nil, nil, time.Minute, "node", "producer.js", url, exchange)
	})
}

// TestIngressPikaProducer: examples/ingress/python/producer.py, with pika
// (x-delay an int: an int32), publishes to the ingress; the consumer gets
// each order as it was sent.
func TestIngressPikaProducer(t *testing.T) {
	if out, err := exec.Command(systemPython, "-c", "import pika").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import pika (%v: %s): run scripts/dev.sh test, which installs python3-pika",
			systemPython, err, strings.TrimSpace(string(out)))
	}
	want := ingressOrders([]int64{1500, 800, 0}, func(d int64) any { return int32(d) }, func() amqp.Table {
		h := ingressCommonHeaders()
		h["meta"] = amqp.Table{"source": "web", "version": int32(3)}
		return h
	})
	runIngressProducer(t, want, func(url, exchange string) string {
		return runExample(t, time.Minute, systemPython, ingressPythonProduce, url, exchange)
	})
}

// excerptOf reports whether snippet is a run of whole lines of source, all
// indented alike there (the page drops the indentation of a method body).
func excerptOf(snippet, source string) bool {
	want := strings.Split(strings.TrimSuffix(snippet, "\n"), "\n")
	src := strings.Split(source, "\n")
	for i := 0; i+len(want) <= len(src); i++ {
		indent, ok := strings.CutSuffix(src[i], want[0])
		if !ok || strings.TrimSpace(indent) != "" {
			continue
		}
		match := true
		for j, l := range want[1:] {
			s := src[i+1+j]
			if l == "" && strings.TrimSpace(s) != "" || l != "" && s != indent+l {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// TestMigrationDocSnippetsAreExamples: every Java, JavaScript and Python
// snippet of the migration page is an excerpt, word for word but for its
// indentation, of the producer of examples/ingress that the tests above
// run; Spring AMQP's lines are plain text (Spring AMQP is not among
// Debian's packages, so nothing here compiles them); no other language.
func TestMigrationDocSnippetsAreExamples(t *testing.T) {
	examples := map[string]string{"java": ingressJavaProducer, "js": ingressNodeProducer, "python": ingressPythonProduce}
	sources := map[string]string{}
	for lang, path := range examples {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sources[lang] = string(b)
	}
	b, err := os.ReadFile(migrationDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?ms)^```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)^```[ \t]*$").FindAllStringSubmatch(string(b), -1)
	checked := map[string]int{}
	for _, m := range blocks {
		lang, snippet := m[1], m[2]
		switch lang {
		case "sh", "text", "":
		case "java", "js", "python":
			checked[lang]++
			if !excerptOf(snippet, sources[lang]) {
				t.Errorf("%s: this %s snippet is not word for word in %s, which the tests run:\n%s", migrationDoc, lang,
					examples[lang], snippet)
			}
		default:
			t.Errorf("%s: a %q snippet: nothing runs it; make it an excerpt of a producer under examples/ingress, "+
				"or plain text", migrationDoc, lang)
		}
	}
	for lang := range examples {
		if checked[lang] == 0 {
			t.Errorf("%s has no %s snippet from %s", migrationDoc, lang, examples[lang])
		}
	}
	t.Logf("snippets checked: %v", checked)
}
