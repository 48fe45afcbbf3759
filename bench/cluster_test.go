package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// -amqp takes a node list: the dispatchers get all of it (the first node
// preferred), the consumer and the raw publisher the first; a quorum
// queue works as the consumer's queue.
func TestBenchNodeList(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	code, stdout, stderr := runBench(t, "-amqp", testenv.AMQPURL(t)+",amqp://guest:guest@127.0.0.1:1/",
		"-mode", "backlog", "-backlog", "2000", "-shards", "4", "-batch", "200", "-size", "100",
		"-queue-type", "quorum", "-ceiling-count", "1000", "-ceiling-window", "300", "-stall", "20s",
		"-json", jsonPath, "-dispatcher", binary)
	if code != exitOK {
		t.Fatalf("exit code %d; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "(2 nodes)") {
		t.Errorf("the machine line does not say 2 nodes:\n%s", stdout)
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 || len(rep.Results) != 1 || rep.Machine.BrokerNodes != 2 || rep.Options.QueueType != "quorum" {
		t.Errorf("failures %q, %d results, %d broker nodes, queue type %q", rep.Failures, len(rep.Results), rep.Machine.BrokerNodes, rep.Options.QueueType)
	}
	assertCleanedUp(t, rep.RunID)
}

// TestMeasureQueueTypes is a measurement, not a check, run on demand
// (DISPATCHER_TEST_MEASURE_CLUSTER=1; a few minutes): the same bench
// against a classic queue on one private node, then against a quorum queue
// on a private 3-node cluster, one after the other on this machine. The
// tables go to the test log and the reports to docs/bench-classic-1.json
// and docs/bench-quorum-3.json.
func TestMeasureQueueTypes(t *testing.T) {
	if os.Getenv("DISPATCHER_TEST_MEASURE_CLUSTER") == "" {
		t.Skip("a measurement: set DISPATCHER_TEST_MEASURE_CLUSTER=1 to run it")
	}
	node := testenv.PrivateRabbit(t)
	cluster := testenv.SharedRabbitCluster(t)
	for _, run := range []struct{ name, amqp, queueType string }{
		{"classic-1", node.AMQPURL(), "classic"},
		{"quorum-3", strings.Join(cluster.URLs(), ","), "quorum"},
	} {
		var out, errOut bytes.Buffer
		code := Main([]string{"-redis", testenv.RedisURL(t), "-amqp", run.amqp, "-queue-type", run.queueType,
			"-mode", "backlog,rate", "-backlog", "100000", "-rate", "1000,3000", "-duration", "15s",
			"-json", filepath.Join("..", "docs", "bench-"+run.name+".json"), "-dispatcher", binary}, &out, &errOut)
		t.Logf("%s:\n%s", run.name, out.String())
		if code != exitOK {
			t.Errorf("%s: exit code %d; stderr:\n%s", run.name, code, errOut.String())
		}
	}
}
