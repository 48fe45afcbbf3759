package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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

// writeEnvFiles writes each Deployment's env to dir/<name>.env.
func writeEnvFiles(objs []object, dir string) error {
	secrets := map[string]*corev1.Secret{}
	for _, o := range objs {
		if s, ok := o.Value.(*corev1.Secret); ok {
			secrets[o.Name] = s
		}
	}
	for _, o := range objs {
		d, ok := o.Value.(*appsv1.Deployment)
		if !ok {
			continue
		}
		lines, err := envLines(d, secrets)
		if err != nil {
			return fmt.Errorf("%s: %w", o, err)
		}
		path := filepath.Join(dir, o.Name+".env")
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return err
		}
	}
	return nil
}
