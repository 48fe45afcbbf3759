#!/usr/bin/env bash
# Checks the Helm chart (deploy/helm/dispatcher) and the KEDA example (deploy/keda):
#   - gofmt, go vet and go test of the checker (deploy/check, its own Go module);
#   - every value set in deploy/helm/dispatcher/ci/*-values.yaml passes `helm lint --strict`,
#     renders, and every rendered object decodes strictly into its Kubernetes API type and
#     passes the checker's rules (deploy/check/rules.go);
#   - the dispatcher itself accepts each rendered environment (`dispatcher stats` gets as far
#     as Redis: exit 1, not 2), and `dispatcher recurring check` each rendered schedule file;
#   - a rendered PrometheusRule passes the project's alert unit tests (promtool), a rendered
#     dashboard is the project's dashboard byte for byte;
#   - every value set in ci/bad/ is refused, with the message its first line names.
# Installs helm (go install, from the Go module proxy) and promtool (Debian package
# prometheus) if they are missing. scripts/dev.sh test runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v3.22.0
# Helm renders for Kubernetes 1.20 unless told; the chart needs 1.27 or later.
KUBE_VERSION=1.31.0
chart=deploy/helm/dispatcher

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'chart-check: %s\n' "$*" >&2; exit 1; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

export PATH="$PATH:$(go env GOPATH)/bin"
if ! command -v helm >/dev/null; then
	log "installing helm $HELM_VERSION (go install)"
	go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
if ! command -v promtool >/dev/null; then
	log "installing promtool (Debian package prometheus)"
	sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

log "deploy/check: gofmt, go vet, go test"
(
	cd deploy/check
	unformatted="$(gofmt -l .)"
	[ -z "$unformatted" ] || die "gofmt needed on: $unformatted"
	go vet ./...
	go test -race -count=1 ./...
	go build -o "$tmp/check" .
)
go build -o "$tmp/dispatcher" ./cmd/dispatcher

# check_render NAME FILE: the checker's decode and rules, then what the
# dispatcher and promtool say of what the objects hold.
check_render() {
	local name="$1" file="$2" out="$tmp/$1.out"
	mkdir -p "$out"
	"$tmp/check" -out "$out" "$file" || die "$name: the checker refuses the render"
	local envfile vars rc
	for envfile in "$out"/*.env; do
		[ -e "$envfile" ] || continue
		mapfile -t vars <"$envfile"
		# The chart's Redis URL is replaced by one that refuses at once: the
		# settings are checked before the connection, which then fails (1).
		rc=0
		env -i "${vars[@]}" DISPATCHER_REDIS_URL=redis://127.0.0.1:1/0 "$tmp/dispatcher" stats >/dev/null 2>"$tmp/err" || rc=$?
		if [ "$rc" != 1 ] || ! grep -q '127.0.0.1:1' "$tmp/err"; then
			die "$name: the dispatcher refuses the rendered environment (exit $rc): $(cat "$tmp/err")"
		fi
	done
	local f
	for f in "$out"/*/schedules.json; do
		[ -e "$f" ] || continue
		"$tmp/dispatcher" recurring check "$f" >/dev/null || die "$name: $f: the recurring schedules are not valid"
	done
	for f in "$out"/*.rules.yml; do
		[ -e "$f" ] || continue
		mkdir -p "$tmp/rules-$name"
		cp "$f" "$tmp/rules-$name/dispatcher-alerts.yml"
		cp deploy/prometheus/dispatcher-alerts_test.yml "$tmp/rules-$name/"
		promtool test rules "$tmp/rules-$name/dispatcher-alerts_test.yml" >/dev/null ||
			die "$name: the rendered PrometheusRule fails the alert unit tests"
	done
	for f in "$out"/*/dispatcher-dashboard.json; do
		[ -e "$f" ] || continue
		cmp -s "$f" deploy/grafana/dispatcher-dashboard.json || die "$name: the rendered dashboard differs from deploy/grafana"
	done
}

for values in "$chart"/ci/*-values.yaml; do
	name="$(basename "$values" -values.yaml)"
	log "chart, values $name: helm lint --strict, helm template, check"
	helm lint --strict --quiet --kube-version "$KUBE_VERSION" -f "$values" "$chart" >/dev/null
	helm template rel "$chart" --namespace ns --kube-version "$KUBE_VERSION" -f "$values" >"$tmp/$name.yaml"
	check_render "$name" "$tmp/$name.yaml"
done

# What particular value sets must render.
grep -q '^kind: Secret$' "$tmp/existing-secret.yaml" && die "existing-secret: the chart created a Secret although both URLs come from one"
grep -q 'name: dispatcher-urls' "$tmp/existing-secret.yaml" || die "existing-secret: the env does not read Secret dispatcher-urls"
grep -q 'terminationGracePeriodSeconds: 40$' "$tmp/queues.yaml" || die "queues: terminationGracePeriodSeconds is not 25 + 15"
grep -q 'terminationGracePeriodSeconds: 25$' "$tmp/default.yaml" || die "default: terminationGracePeriodSeconds is not 10 + 15"
for kind in ServiceMonitor PrometheusRule ConfigMap; do
	grep -q "^kind: $kind$" "$tmp/monitoring.yaml" || die "monitoring: no $kind rendered"
done
grep -q 'grafana_dashboard: "1"' "$tmp/monitoring.yaml" || die "monitoring: the dashboard ConfigMap lacks the sidecar's label"

for values in "$chart"/ci/bad/*-values.yaml; do
	name="$(basename "$values" -values.yaml)"
	want="$(sed -n '1s/^# refused: //p' "$values")"
	[ -n "$want" ] || die "$values: its first line must be '# refused: <part of the message>'"
	log "chart, bad values $name: refused"
	if helm template rel "$chart" --kube-version "$KUBE_VERSION" -f "$values" >/dev/null 2>"$tmp/err"; then
		die "bad values $name: rendered, want refused ($want)"
	fi
	grep -qF -- "$want" "$tmp/err" || die "bad values $name: refused, but not with '$want': $(cat "$tmp/err")"
done

log "KEDA example: check"
"$tmp/check" deploy/keda/scaledobject.yaml >/dev/null
log "chart check passed"
