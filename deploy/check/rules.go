package main

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// What a dispatcher pod must have, whatever the values: the checks below
// hold the chart to what docs/operations.md#kubernetes says.
const (
	// The image's user (distroless nonroot).
	nonrootUID = 65532
	// After DISPATCHER_SHUTDOWN_TIMEOUT the dispatcher gives publishes
	// stuck in the broker connection 5 s and its HTTP server up to 5 s
	// (scanner.Run, httpServer.stop): the grace period covers both.
	minGraceMargin = 10 * time.Second
	// The dispatcher's default DISPATCHER_SHUTDOWN_TIMEOUT.
	defaultShutdownTimeout = 10 * time.Second
)

// checkAll runs the checks of every object and those across objects (a
// selector that selects nothing, a Secret key that is not there).
func checkAll(objs []object) []error {
	var errs []error
	byKind := map[string][]object{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	secrets := map[string]*corev1.Secret{}
	for _, o := range byKind["Secret"] {
		secrets[o.Name] = o.Value.(*corev1.Secret)
	}
	var podLabels []map[string]string
	for _, o := range byKind["Deployment"] {
		d := o.Value.(*appsv1.Deployment)
		podLabels = append(podLabels, d.Spec.Template.Labels)
		for _, err := range checkDeployment(d, secrets) {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
		}
	}
	selectsPods := func(sel labels.Selector) bool {
		for _, l := range podLabels {
			if sel.Matches(labels.Set(l)) {
				return true
			}
		}
		return false
	}
	serviceLabels := map[string]map[string]string{} // Service -> its labels, for ServiceMonitors
	servicePorts := map[string][]string{}
	for _, o := range byKind["Service"] {
		s := o.Value.(*corev1.Service)
		serviceLabels[o.Name] = s.Labels
		for _, p := range s.Spec.Ports {
			servicePorts[o.Name] = append(servicePorts[o.Name], p.Name)
		}
		if len(podLabels) > 0 && !selectsPods(labels.SelectorFromSet(s.Spec.Selector)) {
			errs = append(errs, fmt.Errorf("%s: selector %v selects no pod of the Deployments", o, s.Spec.Selector))
		}
	}
	for _, o := range byKind["PodDisruptionBudget"] {
		p := o.Value.(*policyv1.PodDisruptionBudget)
		if err := checkPDB(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
		} else if sel, _ := metav1.LabelSelectorAsSelector(p.Spec.Selector); len(podLabels) > 0 && !selectsPods(sel) {
			errs = append(errs, fmt.Errorf("%s: selector selects no pod of the Deployments", o))
		}
	}
	for _, o := range byKind["ServiceMonitor"] {
		for _, err := range checkServiceMonitor(o.Value.(*ServiceMonitor), serviceLabels, servicePorts) {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
		}
	}
	for _, o := range byKind["PrometheusRule"] {
		for _, err := range checkPrometheusRule(o.Value.(*PrometheusRule)) {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
		}
	}
	for _, o := range byKind["ScaledObject"] {
		for _, err := range checkScaledObject(o.Value.(*ScaledObject)) {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
		}
	}
	return errs
}

// dispatcherContainer is the container running /dispatcher.
func dispatcherContainer(spec *corev1.PodSpec) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == "dispatcher" {
			return &spec.Containers[i]
		}
	}
	return nil
}

// checkDeployment checks a dispatcher Deployment: URLs from Secrets, the
// endpoint on the pod's address, the probes on the right paths, a grace
// period that covers the shutdown, the restricted security context and
// resources.
func checkDeployment(d *appsv1.Deployment, secrets map[string]*corev1.Secret) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	spec := &d.Spec.Template.Spec
	c := dispatcherContainer(spec)
	if c == nil {
		return []error{fmt.Errorf("no container named dispatcher")}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			fail("env %s is set twice", e.Name)
		}
		env[e.Name] = e
		if e.Value != "" && hasPassword(e.Value) {
			fail("env %s holds a URL with a password as a plain value: take it from a Secret", e.Name)
		}
	}
	for _, name := range []string{"DISPATCHER_REDIS_URL", "DISPATCHER_AMQP_URL"} {
		e, ok := env[name]
		switch {
		case !ok:
			fail("env %s is not set", name)
		case e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil:
			fail("env %s is not taken from a Secret (secretKeyRef)", name)
		default:
			ref := e.ValueFrom.SecretKeyRef
			if s, ok := secrets[ref.Name]; ok && !secretHas(s, ref.Key) {
				fail("env %s: Secret %s has no key %q", name, ref.Name, ref.Key)
			}
		}
	}

	port, err := httpPort(env["DISPATCHER_HTTP_ADDR"].Value)
	if err != nil {
		fail("%v", err)
	}
	portName := ""
	for _, p := range c.Ports {
		if p.ContainerPort == port {
			portName = p.Name
		}
	}
	if err == nil && portName == "" {
		fail("DISPATCHER_HTTP_ADDR's port %d is not a containerPort", port)
	}
	for _, p := range []struct {
		what, path string
		probe      *corev1.Probe
	}{
		// /healthz answers while the process runs; /readyz fails while
		// Redis or the broker is down, which no restart fixes.
		{"startupProbe", "/healthz", c.StartupProbe},
		{"livenessProbe", "/healthz", c.LivenessProbe},
		{"readinessProbe", "/readyz", c.ReadinessProbe},
	} {
		switch {
		case p.probe == nil:
			fail("no %s", p.what)
		case p.probe.HTTPGet == nil:
			fail("%s is not an httpGet", p.what)
		case p.probe.HTTPGet.Path != p.path:
			fail("%s on %s, want %s", p.what, p.probe.HTTPGet.Path, p.path)
		case !(p.probe.HTTPGet.Port.StrVal == portName && portName != "") && p.probe.HTTPGet.Port.IntVal != port:
			fail("%s on port %s, not DISPATCHER_HTTP_ADDR's (%d)", p.what, p.probe.HTTPGet.Port.String(), port)
		}
	}

	timeout := defaultShutdownTimeout
	if e, ok := env["DISPATCHER_SHUTDOWN_TIMEOUT"]; ok {
		if timeout, err = time.ParseDuration(e.Value); err != nil || timeout <= 0 {
			fail("DISPATCHER_SHUTDOWN_TIMEOUT=%q: not a positive duration", e.Value)
		}
	}
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if spec.TerminationGracePeriodSeconds != nil {
		grace = *spec.TerminationGracePeriodSeconds
	}
	if want := int64(math.Ceil((timeout + minGraceMargin).Seconds())); grace < want {
		fail("terminationGracePeriodSeconds %d: want at least %d (DISPATCHER_SHUTDOWN_TIMEOUT %s + %s)", grace, want, timeout, minGraceMargin)
	}

	errs = append(errs, checkSecurity(spec.SecurityContext, c.SecurityContext)...)
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		fail("resources: want CPU and memory requests and a memory limit, have %v", c.Resources)
	}
	return errs
}

// checkSecurity checks the effective security context of the dispatcher
// container (the container's settings over the pod's): Kubernetes's
// "restricted" profile, as the image's nonroot user.
func checkSecurity(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) []error {
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	if c == nil {
		c = &corev1.SecurityContext{}
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	nonRoot, uid, seccomp := pod.RunAsNonRoot, pod.RunAsUser, pod.SeccompProfile
	if c.RunAsNonRoot != nil {
		nonRoot = c.RunAsNonRoot
	}
	if c.RunAsUser != nil {
		uid = c.RunAsUser
	}
	if c.SeccompProfile != nil {
		seccomp = c.SeccompProfile
	}
	if nonRoot == nil || !*nonRoot {
		fail("securityContext: runAsNonRoot is not true")
	}
	if uid == nil || *uid != nonrootUID {
		fail("securityContext: runAsUser is not %d (the image's nonroot user)", nonrootUID)
	}
	if seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost) {
		fail("securityContext: seccompProfile is not RuntimeDefault or Localhost")
	}
	if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		fail("securityContext: readOnlyRootFilesystem is not true")
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		fail("securityContext: allowPrivilegeEscalation is not false")
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") || len(c.Capabilities.Add) > 0 {
		fail("securityContext: capabilities do not drop ALL, or add some")
	}
	return errs
}

// hasPassword reports whether s holds a URL with a password (a comma-
// separated list of them included, as DISPATCHER_AMQP_URL takes).
func hasPassword(s string) bool {
	for _, part := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || u.User == nil {
			continue
		}
		if _, set := u.User.Password(); set {
			return true
		}
		if u.Query().Get("password") != "" { // redis+sentinel://...?password=
			return true
		}
	}
	return false
}

func secretHas(s *corev1.Secret, key string) bool {
	_, inData := s.Data[key]
	_, inString := s.StringData[key]
	return inData || inString
}

// httpPort is the port of DISPATCHER_HTTP_ADDR, which must name a host: a
// port alone binds 127.0.0.1, where the kubelet's probes cannot reach.
func httpPort(addr string) (int32, error) {
	if addr == "" {
		return 0, fmt.Errorf("DISPATCHER_HTTP_ADDR is not set: no probe can answer")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("DISPATCHER_HTTP_ADDR=%q: %w", addr, err)
	}
	if host == "" || host == "localhost" || net.ParseIP(host).IsLoopback() {
		return 0, fmt.Errorf("DISPATCHER_HTTP_ADDR=%q binds loopback only: the kubelet's probes cannot reach it", addr)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("DISPATCHER_HTTP_ADDR=%q: want a port 1 to 65535", addr)
	}
	return int32(n), nil
}

func checkPDB(p *policyv1.PodDisruptionBudget) error {
	if (p.Spec.MinAvailable == nil) == (p.Spec.MaxUnavailable == nil) {
		return fmt.Errorf("want exactly one of minAvailable and maxUnavailable")
	}
	if p.Spec.Selector == nil {
		return fmt.Errorf("no selector")
	}
	return nil
}

func checkServiceMonitor(m *ServiceMonitor, serviceLabels map[string]map[string]string, servicePorts map[string][]string) []error {
	var errs []error
	sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
	if err != nil {
		return []error{err}
	}
	var selected []string
	for name, l := range serviceLabels {
		if sel.Matches(labels.Set(l)) {
			selected = append(selected, name)
		}
	}
	if len(serviceLabels) > 0 && len(selected) == 0 {
		errs = append(errs, fmt.Errorf("selector selects no Service"))
	}
	if len(m.Spec.Endpoints) == 0 {
		errs = append(errs, fmt.Errorf("no endpoints"))
	}
	for _, e := range m.Spec.Endpoints {
		for _, s := range selected {
			if !slices.Contains(servicePorts[s], e.Port) {
				errs = append(errs, fmt.Errorf("endpoint port %q is not a port of Service %s", e.Port, s))
			}
		}
		if e.Path != "/metrics" {
			errs = append(errs, fmt.Errorf("endpoint path %q, want /metrics", e.Path))
		}
		if d, err := time.ParseDuration(e.Interval); err != nil || d > 30*time.Second {
			// The alert rules read the gauges through last_over_time(...[1m]).
			errs = append(errs, fmt.Errorf("endpoint interval %q: want 30s or less", e.Interval))
		}
		job := false
		for _, r := range e.Relabelings {
			job = job || (r.TargetLabel == "job" && r.Replacement != nil && *r.Replacement == "dispatcher")
		}
		if !job {
			errs = append(errs, fmt.Errorf("endpoint does not set job=\"dispatcher\", which the alert rules select"))
		}
	}
	return errs
}

func checkPrometheusRule(p *PrometheusRule) []error {
	var errs []error
	if len(p.Spec.Groups) == 0 {
		errs = append(errs, fmt.Errorf("no rule groups"))
	}
	for _, g := range p.Spec.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			errs = append(errs, fmt.Errorf("group %q: no name or no rules", g.Name))
		}
		for i, r := range g.Rules {
			if (r.Alert == "") == (r.Record == "") || strings.TrimSpace(r.Expr) == "" {
				errs = append(errs, fmt.Errorf("group %q rule %d: want alert or record, and expr", g.Name, i+1))
			}
		}
	}
	return errs
}

// kedaPrometheusKeys are the metadata keys of KEDA's prometheus trigger
// (keda.sh/docs/scalers/prometheus).
var kedaPrometheusKeys = []string{"serverAddress", "query", "queryParameters", "threshold", "activationThreshold",
	"namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "timeout", "authModes"}

func checkScaledObject(s *ScaledObject) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Spec.ScaleTargetRef.Name == "" {
		fail("scaleTargetRef.name is empty")
	}
	if lo, hi := s.Spec.MinReplicaCount, s.Spec.MaxReplicaCount; lo != nil && hi != nil && *lo > *hi {
		fail("minReplicaCount %d > maxReplicaCount %d", *lo, *hi)
	}
	if len(s.Spec.Triggers) == 0 {
		fail("no triggers")
	}
	for i, t := range s.Spec.Triggers {
		if t.Type != "prometheus" {
			continue
		}
		for k := range t.Metadata {
			if !slices.Contains(kedaPrometheusKeys, k) {
				fail("trigger %d: metadata %q is not a prometheus trigger's", i+1, k)
			}
		}
		for _, k := range []string{"serverAddress", "query", "threshold"} {
			if t.Metadata[k] == "" {
				fail("trigger %d: metadata %s is required", i+1, k)
			}
		}
		for _, k := range []string{"threshold", "activationThreshold"} {
			if v, ok := t.Metadata[k]; ok {
				if f, err := strconv.ParseFloat(v, 64); err != nil || f < 0 || (k == "threshold" && f == 0) {
					fail("trigger %d: metadata %s=%q: want a positive number", i+1, k, v)
				}
			}
		}
	}
	return errs
}
