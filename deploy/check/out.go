package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// tlsFileVars name files inside the pod; the dispatcher opens them while
// it loads its settings, so they are left out of the env files, which are
// loaded outside the pod.
var tlsFileVars = []string{"_CA_FILE", "_CERT_FILE", "_KEY_FILE"}

// envLines is the dispatcher container's environment as KEY=VALUE lines,
// values from Secrets of the same render filled in; a value from a Secret
// not rendered here (an existing one) is left out.
func envLines(d *appsv1.Deployment, secrets map[string]*corev1.Secret) ([]string, error) {
	c := dispatcherContainer(&d.Spec.Template.Spec)
	if c == nil {
		return nil, fmt.Errorf("no container named dispatcher")
	}
	var lines []string
env:
	for _, e := range c.Env {
		for _, suffix := range tlsFileVars {
			if strings.HasSuffix(e.Name, suffix) {
				continue env
			}
		}
		v := e.Value
		if e.ValueFrom != nil {
			ref := e.ValueFrom.SecretKeyRef
			if ref == nil {
				continue
			}
			s, ok := secrets[ref.Name]
			if !ok {
				continue
			}
			if sv, ok := s.StringData[ref.Key]; ok {
				v = sv
			} else {
				v = string(s.Data[ref.Key])
			}
		}
		if strings.ContainsAny(v, "\n\r") {
			return nil, fmt.Errorf("env %s: a value over several lines", e.Name)
		}
		lines = append(lines, e.Name+"="+v)
	}
	return lines, nil
}

// writeOut writes what the objects hold for checking by other tools:
// each Deployment's dispatcher env to dir/<name>.env (for the dispatcher's
// own settings check), each ConfigMap's data to dir/<name>/<key> (the
// recurring schedules, the dashboard), and each PrometheusRule's groups as
// a rules file dir/<name>.rules.yml (for promtool).
func writeOut(objs []object, dir string) error {
	secrets := map[string]*corev1.Secret{}
	for _, o := range objs {
		if s, ok := o.Value.(*corev1.Secret); ok {
			secrets[o.Name] = s
		}
	}
	for _, o := range objs {
		var err error
		switch v := o.Value.(type) {
		case *appsv1.Deployment:
			var lines []string
			if lines, err = envLines(v, secrets); err == nil {
				err = os.WriteFile(filepath.Join(dir, o.Name+".env"), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
			}
		case *corev1.ConfigMap:
			if err = os.MkdirAll(filepath.Join(dir, o.Name), 0o755); err != nil {
				break
			}
			for key, data := range v.Data {
				if err = os.WriteFile(filepath.Join(dir, o.Name, key), []byte(data), 0o644); err != nil {
					break
				}
			}
		case *PrometheusRule:
			var b []byte
			if b, err = yaml.Marshal(v.Spec); err == nil {
				err = os.WriteFile(filepath.Join(dir, o.Name+".rules.yml"), b, 0o644)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", o, err)
		}
	}
	return nil
}
