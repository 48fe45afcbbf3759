#!/usr/bin/env bash
# measure-idle.sh [-n QUEUES] [-pairs P] [-settle S] [-measure M] BINARY...: the steady idle cost of
# one instance serving QUEUES (default 1000) empty queues x 16 shards, for each BINARY (a path) in
# turn, P rounds (default 2). Each run uses the Redis on port 16399, which it FLUSHALLs first (so
# keep it private; started here, and left running, if none answers there), and RabbitMQ on
# 127.0.0.1:5672 as guest; it waits S seconds (default 70: the queues doze and their state reads
# have stretched out) and then, over M seconds (default 120: a multiple of the 5 s layout poll and
# the 8 s and 30 s state reads, which come in step for all queues), reads the instance's CPU from
# /proc and Redis's CPU and commands from INFO. One line per run, then each binary's median (gawk).
# Used for docs/performance.md's idle figures; `dispatcher bench -mode idle` measures from the
# instance's start instead, ramp included.
set -euo pipefail
n=1000 pairs=2 settle=70 measure=120
while [ $# -gt 0 ]; do
	case $1 in
	-n) n=$2; shift 2 ;;
	-pairs) pairs=$2; shift 2 ;;
	-settle) settle=$2; shift 2 ;;
	-measure) measure=$2; shift 2 ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-n QUEUES] [-pairs P] [-settle S] [-measure M] BINARY..." >&2; exit 2; }
port=16399
rc() { redis-cli -p $port "$@"; }
if ! rc ping >/dev/null 2>&1; then
	mkdir -p /tmp/measure-idle-redis
	redis-server --daemonize yes --port $port --save "" --appendonly no --dir /tmp/measure-idle-redis >/dev/null
	until rc ping >/dev/null 2>&1; do sleep 0.1; done
fi
qs=$(seq -f "q%g" 0 $((n-1)) | paste -sd,)
env_args=(DISPATCHER_REDIS_URL=redis://127.0.0.1:$port/0 DISPATCHER_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
	DISPATCHER_KEY_PREFIX=idle DISPATCHER_QUEUES=$qs DISPATCHER_HTTP_ADDR= DISPATCHER_LOG_LEVEL=warn)
for i in $(seq 0 $((n-1))); do env_args+=(DISPATCHER_QUEUE_Q${i}_SHARDS=16 DISPATCHER_QUEUE_Q${i}_EXCHANGE=amq.topic); done
redis_cpu() { rc info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.3f", s}'; }
redis_cmds() { rc info commandstats | awk -F'[=,:]' '/^cmdstat_/ {s += $3} END {print s}'; }
out=$(mktemp)
for _ in $(seq "$pairs"); do
	for bin in "$@"; do
		rc flushall >/dev/null
		env "${env_args[@]}" "$bin" >/tmp/measure-idle.log 2>&1 &
		pid=$!
		sleep "$settle"
		t0=$(awk '{print $14+$15}' /proc/$pid/stat) r0=$(redis_cpu) c0=$(redis_cmds)
		sleep "$measure"
		t1=$(awk '{print $14+$15}' /proc/$pid/stat) r1=$(redis_cpu) c1=$(redis_cmds)
		kill $pid; wait $pid 2>/dev/null || true
		line=$(awk -v b="$bin" -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v r0="$r0" -v r1="$r1" -v c="$((c1 - c0))" -v m="$measure" \
			'BEGIN {printf "%s dispatcher_cpu_pct=%.2f redis_cpu_pct=%.2f redis_cmds_per_s=%.0f\n", b, t*100/hz/m, (r1-r0)*100/m, c/m}')
		echo "$line" | tee -a "$out"
	done
done
echo "medians:"
for bin in "$@"; do
	gawk -v b="$bin" '
		$1 != b { next }
		{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]][NR] = kv[2] } }
		END {
			printf "%s", b
			for (k in v) {
				n = asort(v[k], s)
				printf " %s=%s", k, (n % 2 ? s[(n + 1) / 2] : (s[n / 2] + s[n / 2 + 1]) / 2)
			}
			printf "\n"
		}' "$out"
done
rm -f "$out"
