package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readFixture(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// check decodes and checks a stream as the command does, returning every
// error as one string.
func check(data string) string {
	objs, errs := decodeAll([]byte(data), "test")
	errs = append(errs, checkAll(objs)...)
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	return strings.Join(msgs, "\n")
}

// TestFixtureIsGood: the fixture every other case breaks passes, so a
// refusal below is the change's doing.
func TestFixtureIsGood(t *testing.T) {
	if got := check(readFixture(t)); got != "" {
		t.Fatalf("the fixture is refused:\n%s", got)
	}
}

// TestRefused: one change to the fixture each, and the error it must
// produce. old must be in the fixture exactly once, so that no case
// passes by changing nothing.
func TestRefused(t *testing.T) {
	cases := []struct {
		name, old, new, want string
	}{
		// Strict decoding: what kubectl apply --validate=strict refuses.
		{"unknown field", "  replicas: 2\n", "  replica: 2\n", `unknown field "spec.replica"`},
		{"field in another case", "  replicas: 2\n", "  Replicas: 2\n", `unknown field "spec.Replicas"`},
		{"key given twice", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", `"replicas" already set`},
		{"wrong type", "  replicas: 2\n", "  replicas: \"2\"\n", "cannot unmarshal string"},
		{"bad quantity", "memory: 64Mi", "memory: 64 megs", "quantities must match"},
		{"unknown field in a probe", "            periodSeconds: 10\n", "            periodSeconds: 10\n            period: 10\n", `unknown field "spec.template.spec.containers[0].livenessProbe.period"`},
		{"unknown kind", "kind: ServiceAccount", "kind: ServiceAcount", `no type known for apiVersion "v1" kind "ServiceAcount"`},
		{"unknown ServiceMonitor field", "      path: /metrics\n", "      path: /metrics\n      scrapeInterval: 15s\n", `unknown field "spec.endpoints[0].scrapeInterval"`},
		{"unknown PrometheusRule field", "          for: 1m\n", "          for: 1m\n          severity: critical\n", `unknown field "spec.groups[0].rules[0].severity"`},

		// The dispatcher's own rules.
		{"URL as a plain value", "            - name: DISPATCHER_HTTP_ADDR\n",
			"            - name: DISPATCHER_EXTRA\n              value: amqp://app:s3cret@rabbit:5672/\n            - name: DISPATCHER_HTTP_ADDR\n",
			"env DISPATCHER_EXTRA holds a URL with a password as a plain value"},
		{"URL not from a Secret", "            - name: DISPATCHER_REDIS_URL\n              valueFrom:\n                secretKeyRef:\n                  name: rel-dispatcher\n                  key: redis-url\n",
			"            - name: DISPATCHER_REDIS_URL\n              value: redis://redis:6379/0\n", "env DISPATCHER_REDIS_URL is not taken from a Secret"},
		{"Secret without the key", "                  key: amqp-url\n", "                  key: amqp\n", `Secret rel-dispatcher has no key "amqp"`},
		{"liveness on /readyz", "          livenessProbe:\n            httpGet:\n              path: /healthz\n",
			"          livenessProbe:\n            httpGet:\n              path: /readyz\n", "livenessProbe on /readyz, want /healthz"},
		{"readiness on /healthz", "              path: /readyz\n", "              path: /healthz\n", "readinessProbe on /healthz, want /readyz"},
		{"no startup probe", "          startupProbe:\n            httpGet:\n              path: /healthz\n              port: http\n            failureThreshold: 30\n            periodSeconds: 2\n            timeoutSeconds: 2\n", "", "no startupProbe"},
		{"probe on another port", "              path: /readyz\n              port: http\n", "              path: /readyz\n              port: 8080\n", "readinessProbe on port 8080"},
		{"endpoint on loopback", `value: "0.0.0.0:9090"`, `value: ":9090"`, "binds loopback only"},
		{"grace shorter than the shutdown", "terminationGracePeriodSeconds: 25", "terminationGracePeriodSeconds: 15", "terminationGracePeriodSeconds 15: want at least 20"},
		{"longer shutdown, same grace", `value: "10s"`, `value: "30s"`, "terminationGracePeriodSeconds 25: want at least 40"},
		{"writable root", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem is not true"},
		{"privilege escalation", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "allowPrivilegeEscalation is not false"},
		{"capabilities kept", "              - ALL\n", "              - NET_RAW\n", "capabilities do not drop ALL"},
		{"root", "            runAsUser: 65532\n", "            runAsUser: 0\n", "runAsUser is not 65532"},
		{"no seccomp", "        seccompProfile:\n          type: RuntimeDefault\n", "", "seccompProfile is not RuntimeDefault"},
		{"no memory limit", "            limits:\n              memory: 256Mi\n", "", "want CPU and memory requests and a memory limit"},
		{"PDB selects nothing", "spec:\n  maxUnavailable: 1\n  unhealthyPodEvictionPolicy: AlwaysAllow\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: dispatcher\n",
			"spec:\n  maxUnavailable: 1\n  unhealthyPodEvictionPolicy: AlwaysAllow\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: dispatch\n", "PodDisruptionBudget/rel-dispatcher (policy/v1): selector selects no pod"},
		{"ServiceMonitor without job", "          replacement: dispatcher\n", "          replacement: rel-dispatcher\n", `does not set job="dispatcher"`},
		{"ServiceMonitor scraping too rarely", "      interval: 15s\n", "      interval: 1m\n", `endpoint interval "1m": want 30s or less`},
		{"ServiceMonitor on a port the Service lacks", "    - port: http\n", "    - port: metrics\n", `endpoint port "metrics" is not a port of Service rel-dispatcher`},
	}
	fixture := readFixture(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if n := strings.Count(fixture, c.old); n != 1 {
				t.Fatalf("%q is in the fixture %d times, want once", c.old, n)
			}
			got := check(strings.Replace(fixture, c.old, c.new, 1))
			if !strings.Contains(got, c.want) {
				t.Errorf("errors:\n%s\nwant one containing %q", got, c.want)
			}
		})
	}
}

// TestRun: the command's exit codes and output.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(readFixture(t), "  replicas: 2\n", "  replica: 2\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-out", dir, "testdata/good.yaml"}, nil, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "ok: 8 objects") {
		t.Errorf("good: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	env, err := os.ReadFile(filepath.Join(dir, "rel-dispatcher.env"))
	if err != nil || !strings.Contains(string(env), "DISPATCHER_REDIS_URL=redis://redis:6379/0\n") || !strings.Contains(string(env), "DISPATCHER_QUEUES=default\n") {
		t.Errorf("env file: %v\n%s", err, env)
	}
	if _, err := os.Stat(filepath.Join(dir, "rel-dispatcher.rules.yml")); err != nil {
		t.Errorf("rules file: %v", err)
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{bad}, nil, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), `unknown field "spec.replica"`) {
		t.Errorf("bad: exit %d, stderr %q", code, errOut.String())
	}
	if code := run(nil, nil, &out, &errOut); code != 2 {
		t.Errorf("no file: exit %d, want 2", code)
	}
	if code := run([]string{"-"}, strings.NewReader(readFixture(t)), &out, &errOut); code != 0 {
		t.Errorf("stdin: exit %d, stderr %q", code, errOut.String())
	}
}
