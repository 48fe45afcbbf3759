package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one decoded manifest: its kind and name, where it came from,
// and the typed value.
type object struct {
	APIVersion, Kind, Name string
	Where                  string // file and document number
	Value                  any    // *appsv1.Deployment, *ServiceMonitor, ...
}

func (o object) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.Where, o.Kind, o.Name, o.APIVersion)
}

// kinds are the objects the chart and the examples may contain, each with
// the type it is decoded into: k8s.io/api for the built-in kinds, the
// local definitions of crds.go for the others.
var kinds = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &PrometheusRule{} },
	"keda.sh/v1alpha1/ScaledObject":           func() any { return &ScaledObject{} },
}

// documents splits a YAML stream into its documents, leaving out the
// empty ones (a template that rendered nothing, comments only).
func documents(r io.Reader) ([][]byte, error) {
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs [][]byte
	for {
		doc, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return nil, fmt.Errorf("document %d: %w", len(docs)+1, err)
		}
		if len(probe) == 0 {
			continue
		}
		docs = append(docs, doc)
	}
}

// decode decodes one document strictly into the type of its kind: a field
// the type does not have, a field spelt in another case, a key given twice
// or a value of the wrong type is an error, as the API server's strict
// field validation has it.
func decode(doc []byte, where string) (object, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, fmt.Errorf("%s: %w", where, err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		return object{}, fmt.Errorf("%s: %w", where, err)
	}
	o := object{APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name, Where: where}
	newValue, ok := kinds[o.APIVersion+"/"+o.Kind]
	if !ok {
		return o, fmt.Errorf("%s: no type known for apiVersion %q kind %q", o, o.APIVersion, o.Kind)
	}
	o.Value = newValue()
	strict, err := kjson.UnmarshalStrict(j, o.Value, kjson.DisallowUnknownFields)
	if err != nil {
		return o, fmt.Errorf("%s: %w", o, err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return o, fmt.Errorf("%s: %s", o, strings.Join(msgs, "; "))
	}
	if o.Name == "" {
		return o, fmt.Errorf("%s: no metadata.name", o)
	}
	return o, nil
}

// decodeAll decodes every document of a stream; where names the stream.
func decodeAll(data []byte, where string) ([]object, []error) {
	docs, err := documents(bytes.NewReader(data))
	if err != nil {
		return nil, []error{fmt.Errorf("%s: %w", where, err)}
	}
	var objs []object
	var errs []error
	for i, doc := range docs {
		o, err := decode(doc, fmt.Sprintf("%s#%d", where, i+1))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return objs, errs
}
