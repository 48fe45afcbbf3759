package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

// The monitoring files in deploy/ (see deploy/README.md).
const (
	alertRulesFile = "../deploy/prometheus/dispatcher-alerts.yml"
	alertTestsFile = "../deploy/prometheus/dispatcher-alerts_test.yml"
	dashboardFile  = "../deploy/grafana/dispatcher-dashboard.json"
	// The KEDA example's query, as a recording rule, and its unit tests.
	kedaRulesFile = "../deploy/keda/consumers-forecast-rules.yml"
	kedaTestsFile = "../deploy/keda/consumers-forecast-rules_test.yml"
	// The Helm chart's copies of the rules and the dashboard: Helm reads
	// files inside the chart only.
	chartFilesDir = "../deploy/helm/dispatcher/files"
)

// wantAlerts are the alerts deploy/prometheus defines; runbooks, routes and
// silences refer to them by name, so a rename must be deliberate.
var wantAlerts = []string{
	"DispatcherQueueLate",
	"DispatcherQueueStalled",
	"DispatcherTasksRetried",
	"DispatcherPublishesFailing",
	"DispatcherProducerShardCount",
	"DispatcherDeadLettersGrowing",
	"DispatcherBrokerBlocked",
	"DispatcherBrokerDisconnected",
	"DispatcherBrokerNodeFlapping",
	"DispatcherNoSweeper",
	"DispatcherInstanceDown",
	"DispatcherAllInstancesDown",
	"DispatcherShardBroken",
	"DispatcherQueuePausedLong",
	"DispatcherThunderingHerd",
	"DispatcherIngressBehind",
	"DispatcherIngressBacklog",
	"DispatcherIngressNotConsuming",
	"DispatcherIngressRefusing",
}

// promtool runs promtool with args and returns its output; it fails the
// test if promtool is missing or exits non-zero.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): run scripts/dev.sh test, which installs it (Debian package prometheus)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	alertLine    = regexp.MustCompile(`^\s*- alert:\s*(\S+)\s*$`)
	ruleLine     = regexp.MustCompile(`^\s*- (alert|record|name):`)
	alertNameRef = regexp.MustCompile(`^\s*- alertname:\s*(\S+)\s*$`)
	expAlerts    = regexp.MustCompile(`^\s*exp_alerts:\s*(.*?)\s*$`)
)

// alertRules splits the rules file into its alerting rules: name -> the
// text of the rule. A plain line scan, enough for the file's layout (one
// rule per "- alert:" item); promtool checks the YAML itself.
func alertRules(text string) map[string]string {
	rules := map[string]string{}
	name := ""
	for _, l := range strings.Split(text, "\n") {
		if ruleLine.MatchString(l) {
			name = ""
			if m := alertLine.FindStringSubmatch(l); m != nil {
				name = m[1]
			}
			continue
		}
		if name != "" {
			rules[name] += l + "\n"
		}
	}
	return rules
}

// TestAlertRules: deploy/prometheus/dispatcher-alerts.yml is valid
// (promtool check rules) and its unit tests pass (promtool test rules);
// every alert has a severity, a summary and a description, and the unit
// tests have, for every alert, a case where it fires and one where it
// must not.
func TestAlertRules(t *testing.T) {
	t.Logf("%s", promtool(t, "check", "rules", alertRulesFile))
	t.Logf("%s", promtool(t, "test", "rules", alertTestsFile))

	rules := alertRules(readFile(t, alertRulesFile))
	var names []string
	for name, body := range rules {
		names = append(names, name)
		if !regexp.MustCompile(`(?m)^\s*severity:\s*(warning|critical)\s*$`).MatchString(body) {
			t.Errorf("alert %s: no severity label warning or critical", name)
		}
		for _, a := range []string{"summary", "description"} {
			if !regexp.MustCompile(`(?m)^\s*` + a + `:\s*\S`).MatchString(body) {
				t.Errorf("alert %s: no %s annotation", name, a)
			}
		}
		// The annotations say which queue or instance, and how bad; an
		// absent() alert has no labels to name.
		if !strings.Contains(body, "absent(") && !strings.Contains(body, "$labels.") {
			t.Errorf("alert %s: its annotations name no queue or instance ($labels)", name)
		}
	}
	sort.Strings(names)
	want := slices.Sorted(slices.Values(wantAlerts))
	if !slices.Equal(names, want) {
		t.Errorf("alerts in %s:\n got %v\nwant %v", alertRulesFile, names, want)
	}

	fires, silent := map[string]bool{}, map[string]bool{}
	current := ""
	for _, l := range strings.Split(readFile(t, alertTestsFile), "\n") {
		if m := alertNameRef.FindStringSubmatch(l); m != nil {
			current = m[1]
			continue
		}
		if m := expAlerts.FindStringSubmatch(l); m != nil && current != "" {
			if m[1] == "[]" {
				silent[current] = true
			} else {
				fires[current] = true
			}
			current = ""
		}
	}
	for _, name := range wantAlerts {
		if !fires[name] {
			t.Errorf("%s: no case where %s fires", alertTestsFile, name)
		}
		if !silent[name] {
			t.Errorf("%s: no case where %s must not fire", alertTestsFile, name)
		}
	}
}

// The parts of a Grafana dashboard model the tests look at.
type (
	grafanaDatasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	grafanaTarget struct {
		RefID      string             `json:"refId"`
		Expr       string             `json:"expr"`
		Datasource *grafanaDatasource `json:"datasource"`
	}
	grafanaPanel struct {
		ID         int                `json:"id"`
		Type       string             `json:"type"`
		Title      string             `json:"title"`
		Datasource *grafanaDatasource `json:"datasource"`
		GridPos    struct{ X, Y, W, H int }
		Targets    []grafanaTarget `json:"targets"`
		Panels     []grafanaPanel  `json:"panels"` // of a collapsed row
	}
	grafanaVariable struct {
		Name       string             `json:"name"`
		Type       string             `json:"type"`
		Query      json.RawMessage    `json:"query"`
		Definition string             `json:"definition"`
		Datasource *grafanaDatasource `json:"datasource"`
		Multi      bool               `json:"multi"`
		IncludeAll bool               `json:"includeAll"`
	}
	grafanaDashboard struct {
		UID           string         `json:"uid"`
		Title         string         `json:"title"`
		SchemaVersion int            `json:"schemaVersion"`
		Panels        []grafanaPanel `json:"panels"`
		Templating    struct {
			List []grafanaVariable `json:"list"`
		} `json:"templating"`
	}
)

func loadDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	var d grafanaDashboard
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels lists the panels, those inside collapsed rows included.
func (d grafanaDashboard) allPanels() []grafanaPanel {
	var out []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// dashboardQuery is one PromQL query of the dashboard.
type dashboardQuery struct{ where, expr string }

// queries lists the targets' expressions and, as a query of its own, the
// metric the queue variable takes its values from.
func (d grafanaDashboard) queries() []dashboardQuery {
	var out []dashboardQuery
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out = append(out, dashboardQuery{fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID), tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			out = append(out, dashboardQuery{"variable " + v.Name, m[1]})
		}
	}
	return out
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)

// grafanaVars are the variables Grafana interpolates into the queries,
// with a value that keeps the query valid PromQL.
var grafanaVars = strings.NewReplacer(
	"${__rate_interval}", "5m", "$__rate_interval", "5m",
	"${__interval}", "5m", "$__interval", "5m",
	"${__range}", "5m", "$__range", "5m",
	"${queue:regex}", ".*", "${queue}", ".*", "$queue", ".*",
)

// TestDashboardQueries: the Grafana dashboard is a dashboard model whose
// panels have titles and unique ids and query the ${datasource} variable,
// with a multi-value queue variable; every query, with Grafana's
// variables filled in, is valid PromQL (promtool check rules, on the
// queries written as recording rules).
func TestDashboardQueries(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("dashboard uid %q, title %q, schemaVersion %d: want a uid, a title and schemaVersion >= 36", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]grafanaVariable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("variable datasource: type %q, query %s; want a datasource variable of Prometheus data sources", v.Type, v.Query)
	}
	if v := vars["queue"]; v.Type != "query" || v.Definition != "label_values(dispatcher_sweeper, queue)" || !v.Multi || !v.IncludeAll ||
		v.Datasource == nil || v.Datasource.UID != "${datasource}" {
		t.Errorf("variable queue: %+v; want label_values(dispatcher_sweeper, queue) from ${datasource}, multi-value with All", v)
	}

	ids := map[int]string{}
	for _, p := range d.allPanels() {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.Title == "" {
			t.Errorf("%s: no title", name)
		}
		if p.ID <= 0 {
			t.Errorf("%s: no id", name)
		} else if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", name, other)
		}
		ids[p.ID] = p.Title
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24 columns", name, g)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("%s: datasource %+v; want the variable ${datasource}", name, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", name)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s target %s: datasource %+v; want the variable ${datasource}", name, tg.RefID, tg.Datasource)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: target refId %q missing or repeated", name, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s target %s: no expr", name, tg.RefID)
			}
		}
	}

	// The queries as recording rules: promtool parses each one. JSON is
	// YAML, so the file is written with encoding/json.
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, q := range d.queries() {
		expr := grafanaVars.Replace(q.expr)
		if strings.Contains(expr, "$") {
			t.Errorf("%s: a Grafana variable the test does not know: %s", q.where, q.expr)
			continue
		}
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: expr})
		t.Logf("%s: %s", q.where, expr)
	}
	file := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	b, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", promtool(t, "check", "rules", path))
}

// TestDeployChartCopies: the chart's copies of the alert rules and the
// dashboard, which its PrometheusRule and dashboard ConfigMap carry, are
// byte for byte the files in deploy/prometheus and deploy/grafana: edit
// those, then copy them over.
func TestDeployChartCopies(t *testing.T) {
	for _, orig := range []string{alertRulesFile, dashboardFile} {
		copied := filepath.Join(chartFilesDir, filepath.Base(orig))
		if readFile(t, copied) != readFile(t, orig) {
			t.Errorf("%s differs from %s: cp %s %s", copied, orig,
				strings.TrimPrefix(orig, "../"), strings.TrimPrefix(copied, "../"))
		}
	}
}

// TestDeployKEDAQuery: the KEDA example's query (deploy/keda, as a
// recording rule; deploy/check's tests hold it identical to the
// ScaledObject's) is valid, and its unit tests pass: it follows the
// forecast, takes the max (not the sum) of two instances reporting the
// queue while the sweeper role moves, bridges the gap between them, and
// reads no other queue.
func TestDeployKEDAQuery(t *testing.T) {
	t.Logf("%s", promtool(t, "check", "rules", kedaRulesFile))
	t.Logf("%s", promtool(t, "test", "rules", kedaTestsFile))
}

var metricName = regexp.MustCompile(`\bdispatcher_[a-z0-9_]*[a-z0-9]\b`)

// deployedMetricNames lists the dispatcher_* metric names the alert rules
// and the KEDA example's rule (their comments left out) and the
// dashboard's queries use.
func deployedMetricNames(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, file := range []string{alertRulesFile, kedaRulesFile} {
		for _, l := range strings.Split(readFile(t, file), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "#") {
				continue
			}
			for _, n := range metricName.FindAllString(l, -1) {
				seen[n] = true
			}
		}
	}
	for _, q := range loadDashboard(t).queries() {
		for _, n := range metricName.FindAllString(q.expr, -1) {
			seen[n] = true
		}
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// exposedNotSeen are metrics the deploy files may use although a
// dispatcher does not show them without the events they count.
var exposedNotSeen = map[string]string{
	// A CounterVec by queue and kind whose children are created on the
	// first error of a kind; client_golang writes neither samples nor
	// HELP/TYPE for a vector without children, so a healthy dispatcher
	// does not show it. (TestWrongTypeShardDoesNotStopOthers sees it.)
	"dispatcher_errors_total": "only after an error",
}

// missingMetrics lists the names a /metrics body does not show: neither a
// sample nor a TYPE line; a histogram's _bucket, _sum and _count count as
// the histogram.
func missingMetrics(body string, names []string) []string {
	types := map[string]string{}
	samples := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		} else if l != "" && !strings.HasPrefix(l, "#") {
			if i := strings.IndexAny(l, "{ "); i > 0 {
				samples[l[:i]] = true
			}
		}
	}
	var missing []string
	for _, n := range names {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n, suffix); ok && types[base] == "histogram" {
				n = base
			}
		}
		if types[n] == "" && !samples[n] && exposedNotSeen[n] == "" {
			missing = append(missing, n)
		}
	}
	return missing
}

// TestDeployedMetricsExist: every dispatcher_* metric the alert rules and
// the dashboard use is exported by a running dispatcher that dispatched a
// few tasks (the queue-state gauges by the queue's sweeper, a moment after
// it took the role), so that a renamed or misspelt metric cannot leave an
// alert or a panel silently empty.
func TestDeployedMetricsExist(t *testing.T) {
	names := deployedMetricNames(t)
	if len(names) < 10 {
		t.Fatalf("only %d dispatcher metrics found in the deploy files: %v", len(names), names)
	}
	t.Logf("metrics used: %v", names)

	// With its AMQP ingress on (a queue name of its own: the ingress
	// queue is named after it).
	queue := fmt.Sprintf("deploy-%d", time.Now().UnixNano()%1_000_000_000)
	h := newHarness(t, queueSpec{Name: queue, Shards: 4})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra[config.QueuePrefix(queue)+"_INGRESS_EXCHANGE"] = h.prefix + ".ingress"
	t.Cleanup(func() {
		if c, err := h.conn.Channel(); err == nil {
			_, _ = c.QueueDelete(ingress.QueueName(queue), false, false, false)
			_ = c.ExchangeDelete(h.prefix+".ingress", false, false)
			c.Close()
		}
	})
	h.start()
	eventually(t, 20*time.Second, "/metrics answering", func() bool {
		_, err := httpGet("http://" + addr + "/metrics")
		return err == nil
	})
	want := scheduleSpread(t, h.producer(queue), queue, 20, time.Now(), 200*time.Millisecond)
	h.verify(queue, want, 20*time.Second, 0)

	var missing []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, err := httpGet("http://" + addr + "/metrics")
		if err == nil {
			if missing = missingMetrics(body, names); len(missing) == 0 {
				return
			}
		} else {
			missing = []string{err.Error()}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("metrics used by deploy/ that the dispatcher does not export (polled /metrics for 10 s): %v", missing)
}
