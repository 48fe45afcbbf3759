package main

import (
	"os"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKEDAExample: deploy/keda/scaledobject.yaml decodes strictly and
// passes the checks, and its query is, character for character, the
// recording rule that consumers-forecast-rules_test.yml tests with
// promtool (tests/deploy_test.go runs it).
func TestKEDAExample(t *testing.T) {
	data, err := os.ReadFile("../keda/scaledobject.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, errs := decodeAll(data, "scaledobject.yaml")
	errs = append(errs, checkAll(objs)...)
	for _, err := range errs {
		t.Error(err)
	}
	if len(objs) != 1 {
		t.Fatalf("%d objects, want one ScaledObject", len(objs))
	}
	so := objs[0].Value.(*ScaledObject)
	var queries []string
	for _, tr := range so.Spec.Triggers {
		if tr.Type == "prometheus" {
			queries = append(queries, tr.Metadata["query"])
		}
	}
	if len(queries) != 1 {
		t.Fatalf("prometheus triggers' queries: %q, want one", queries)
	}

	rulesData, err := os.ReadFile("../keda/consumers-forecast-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(rulesData, &rules); err != nil {
		t.Fatalf("consumers-forecast-rules.yml: %v", err)
	}
	var exprs []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	if len(exprs) != 1 || exprs[0] != queries[0] {
		t.Errorf("the recording rules' exprs %q; want exactly the ScaledObject's query %q", exprs, queries[0])
	}
}
