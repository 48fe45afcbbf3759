#!/usr/bin/env bash
# One entry point for a fresh Debian machine with Go:
#   scripts/dev.sh run    install/start Redis and RabbitMQ if needed, and what examples/ needs
#                         (DEV_SKIP_EXAMPLE_DEPS=1 skips that), build, run the dispatcher
#   scripts/dev.sh test   install/start them if needed, then gofmt, go vet and go test -race
#                         in every Go module, and the release check
# Tests find the servers through DISPATCHER_TEST_REDIS_URL / DISPATCHER_TEST_AMQP_URL,
# or on localhost; set DEV_SKIP_SERVICES=1 to leave services alone.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
	log "installing $*"
	sudo_ env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
rabbit_up() { timeout 2 bash -c '</dev/tcp/127.0.0.1/5672' 2>/dev/null; }

ensure_redis() {
	redis_up && return 0
	command -v redis-server >/dev/null || apt_install redis-server redis-tools
	log "starting redis-server on 127.0.0.1:6379"
	sudo_ mkdir -p /var/lib/redis /var/log/redis
	sudo_ redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
		--dir /var/lib/redis --logfile /var/log/redis/ci.log
	for _ in $(seq 50); do redis_up && return 0; sleep 0.2; done
	log "redis did not come up"; return 1
}

ensure_rabbit() {
	rabbit_up && return 0
	command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
	log "starting rabbitmq-server"
	sudo_ rabbitmq-server -detached || true
	sudo_ rabbitmqctl await_startup --timeout 120 >/dev/null 2>&1 || true
	for _ in $(seq 120); do rabbit_up && return 0; sleep 1; done
	log "rabbitmq did not come up"; return 1
}

# The Python producers (examples/python, clients/python, the cluster contract
# test's) run with Debian's interpreter; the package's test installs it with
# pip and setuptools into a virtual environment, offline.
ensure_python_test_deps() {
	/usr/bin/python3 -c 'import setuptools, wheel, pip, venv, redis.cluster, xxhash' 2>/dev/null && return 0
	apt_install python3-redis python3-xxhash python3-pip python3-setuptools python3-wheel python3-venv
}

# The Node producer package (clients/node): its tests run with node --test;
# tests/clients_test.go runs npm ci there itself, from npm's cache once it ran.
ensure_node() {
	command -v node >/dev/null && command -v npm >/dev/null && return 0
	apt_install nodejs npm
}

# The amqplib producer of examples/ingress (the migration page's; run by
# tests/ingress_clients_test.go, which does not install it): amqplib from npm
# into examples/ingress/node/node_modules, unless npm's record of the install
# there is newer than its package-lock.json. The Java and pika producers
# there need only Debian's packages (ensure_example_deps).
ensure_node_example_deps() {
	ensure_node
	local dir=examples/ingress/node
	[ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ] && return 0
	log "npm ci in $dir"
	(cd "$dir" && npm ci --prefer-offline --no-audit --no-fund)
}

# Test tools from Debian: promtool (package prometheus) checks and unit-tests
# deploy/prometheus and the dashboard's queries (tests/deploy_test.go);
# chromium is the headless browser for tests that need one.
ensure_test_tools() {
	local pkgs=()
	command -v promtool >/dev/null || pkgs+=(prometheus)
	command -v chromium >/dev/null || pkgs+=(chromium)
	# gcc builds the clock-shift preload of tests that step Redis's clock
	# (internal/testenv/clockshift.go).
	command -v gcc >/dev/null || pkgs+=(gcc libc6-dev)
	[ "${#pkgs[@]}" = 0 ] || apt_install "${pkgs[@]}"
}

# The examples (tests/examples_test.go): the Java consumer needs the RabbitMQ
# Java client (with slf4j, a dependency) and lz4-java's XXH64, and a JDK; the
# Java producer of examples/ingress (tests/ingress_clients_test.go) the client.
ensure_example_deps() {
	local pkgs=()
	[ -f /usr/share/java/amqp-client.jar ] || pkgs+=(librabbitmq-client-java)
	[ -f /usr/share/java/lz4-java.jar ] || pkgs+=(liblz4-java)
	command -v javac >/dev/null || pkgs+=(default-jdk-headless)
	# docs/consumers.md's consumers (tests/consumers_doc_test.go) and the pika
	# producer of examples/ingress (tests/ingress_clients_test.go): pika, and
	# SQLite's JDBC driver for the Java one's database.
	/usr/bin/python3 -c 'import pika' 2>/dev/null || pkgs+=(python3-pika)
	[ -f /usr/share/java/sqlite-jdbc.jar ] || pkgs+=(libxerial-sqlite-jdbc-java)
	[ "${#pkgs[@]}" = 0 ] || apt_install "${pkgs[@]}"
}

ensure_services() {
	[ "${DEV_SKIP_SERVICES:-}" = 1 ] && return 0
	ensure_redis
	ensure_rabbit
}

# modules lists the directory of every Go module in the repository: the
# daemon's at the root, and nested ones (shard/, the producer library with
# its own go.mod) that the root's ./... does not reach.
modules() {
	{ git ls-files --cached --others --exclude-standard '*go.mod' 2>/dev/null || find . -name go.mod -not -path './.git/*'; } |
		grep -v '/testdata/' | xargs -n1 dirname | sort -u
}

cmd="${1:-}"
case "$cmd" in
run)
	ensure_services
	# What examples/ needs (examples/README.md); DEV_SKIP_EXAMPLE_DEPS=1 skips it.
	if [ "${DEV_SKIP_EXAMPLE_DEPS:-}" != 1 ]; then
		ensure_python_test_deps
		ensure_example_deps
		ensure_node_example_deps
	fi
	log "building ./bin/dispatcher"
	# dispatcher --version: devel and the checkout's commit, +dirty with
	# uncommitted changes (cmd/dispatcher/cli_version.go). Given at link time
	# because a machine's GOFLAGS may hold -buildvcs=false; release builds
	# set the version too (.goreleaser.yaml).
	commit="$(git rev-parse HEAD 2>/dev/null || true)"
	if [ -n "$commit" ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then commit="$commit+dirty"; fi
	go build -ldflags "-X main.buildCommit=$commit" -o bin/dispatcher ./cmd/dispatcher
	export DISPATCHER_QUEUES="${DISPATCHER_QUEUES:-default}"
	export DISPATCHER_QUEUE_DEFAULT_SHARDS="${DISPATCHER_QUEUE_DEFAULT_SHARDS:-16}"
	export DISPATCHER_QUEUE_DEFAULT_EXCHANGE="${DISPATCHER_QUEUE_DEFAULT_EXCHANGE:-tasks}"
	export DISPATCHER_HTTP_ADDR="${DISPATCHER_HTTP_ADDR-127.0.0.1:9090}"
	log "running; stop with Ctrl-C. To schedule a task and see it arrive, run in another terminal"
	log "the three lines of README.md's quick start (./bin/dispatcher schedule, tail, stats)"
	exec ./bin/dispatcher
	;;
test)
	ensure_services
	ensure_python_test_deps
	ensure_test_tools
	ensure_example_deps
	ensure_node
	ensure_node_example_deps
	log "gofmt"
	unformatted="$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"
	if [ -n "$unformatted" ]; then
		echo "gofmt needed on:"; echo "$unformatted"; exit 1
	fi
	# go vet and go test ./... stay inside one module: run them in each
	# (deploy/check is the chart checker's: scripts/chart-check.sh runs it).
	for mod in $(modules | grep -vx 'deploy/check'); do
		log "go vet ($mod)"
		(cd "$mod" && go vet ./...)
	done
	for mod in $(modules | grep -vx 'deploy/check'); do
		log "go test -race ($mod)"
		(cd "$mod" && go test -race -count=1 -timeout 40m "${@:2}" ./...)
	done
	# goreleaser check, a snapshot build, RELEASES against CHANGELOG.md.
	scripts/release-check.sh
	scripts/chart-check.sh # Helm chart, KEDA example, deploy/check (a module of its own)
	;;
*)
	echo "usage: $0 run|test [go test flags]" >&2
	exit 2
	;;
esac
