#!/usr/bin/env bash
# measure-start.sh BINARY N [REDIS_URL]: start the dispatcher BINARY with N queues x 16 shards
# (RabbitMQ on 127.0.0.1:5672 as guest, HTTP on 127.0.0.1:19191), time until /readyz answers 200,
# then after 20 s idle print its goroutines and Go heap in use (/metrics), RSS (/proc), CPU over
# the next 10 s (% of a core) and Redis's subscriber connections. Used for docs/performance.md's
# start and memory tables; REDIS_URL defaults to a private Redis on port 16399.
set -euo pipefail
bin=$1; n=$2; redis=${3:-redis://127.0.0.1:16399/0}
prefix=st$RANDOM
qs=$(seq -f "q%g" 0 $((n-1)) | paste -sd,)
env_args=(DISPATCHER_REDIS_URL=$redis DISPATCHER_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ DISPATCHER_KEY_PREFIX=$prefix
  DISPATCHER_QUEUES=$qs DISPATCHER_HTTP_ADDR=127.0.0.1:19191 DISPATCHER_LOG_LEVEL=warn)
for i in $(seq 0 $((n-1))); do env_args+=(DISPATCHER_QUEUE_Q${i}_SHARDS=16 DISPATCHER_QUEUE_Q${i}_EXCHANGE=amq.topic); done
start=$(date +%s.%N)
env "${env_args[@]}" "$bin" > /tmp/startup.$n.log 2>&1 &
pid=$!
until curl -fs -o /dev/null http://127.0.0.1:19191/readyz; do sleep 0.02; done
ready=$(echo "$(date +%s.%N) - $start" | bc)
sleep 20
m() { curl -fs http://127.0.0.1:19191/metrics | awk -v k="$1" '$1==k {print $2}'; }
t0=$(awk '{print $14+$15}' /proc/$pid/stat); sleep 10; t1=$(awk '{print $14+$15}' /proc/$pid/stat)
cpu=$(echo "scale=2; ($t1-$t0)/10" | bc)  # clock ticks (100/s) per s -> % of a core
echo "queues=$n ready_s=$ready goroutines=$(m go_goroutines) rss_mb=$(awk '/VmRSS/ {print int($2/1024)}' /proc/$pid/status) heap_inuse_mb=$(curl -fs http://127.0.0.1:19191/metrics | awk '$1=="go_memstats_heap_inuse_bytes" {printf "%d", $2/1048576}') cpu_pct=$cpu subs=$(redis-cli -p $(echo $redis | sed -E "s#.*:([0-9]+).*#\1#") 2>/dev/null CLIENT LIST TYPE pubsub | wc -l)"
kill $pid; wait $pid 2>/dev/null || true
