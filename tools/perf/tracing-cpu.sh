#!/usr/bin/env bash
# CPU per request of `pdserve up` (simulated model with no step time, tiny KV)
# with tracing off and on, for several binaries, alternated: each SPEC is
# NAME=BINARY:off or NAME=BINARY:on ("on": every pdserve process gets
# OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$SINK_PORT, where an OTLP/HTTP
# receiver must listen: go run ./tools/perf/otlpsink -addr 127.0.0.1:46318).
# Each round sends NREQ requests at concurrency CONC (32-token prompts, 16
# output tokens) to each `up` in turn and prints its requests/s, E2E p50 and
# the up process's CPU (user + system) per request. The `up`s listen on
# ports 46100 and up.
# Usage: tools/perf/tracing-cpu.sh ROUNDS NREQ CONC SPEC...
#   e.g. tools/perf/tracing-cpu.sh 6 6000 64 beforeoff=/tmp/pdserve-old:off beforeon=/tmp/pdserve-old:on afteroff=./pdserve:off afteron=./pdserve:on
set -u
SINK_PORT=${SINK_PORT:-46318}
R=$1; N=$2; C=$3; shift 3
SIM=(--sim-profile none --sim-layers 2 --sim-kv-heads 1 --sim-head-dim 16)
T=$(mktemp -d); PIDS=(); names=(); ports=(); pids=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
port=46100
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}; bin=${rest%%:*}; mode=${rest##*:}
  if [ "$mode" = on ]; then
    env OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$SINK_PORT "$bin" up --port $port "${SIM[@]}" >"$T/$name.log" 2>&1 &
  else
    env "$bin" up --port $port "${SIM[@]}" >"$T/$name.log" 2>&1 &
  fi
  p=$!; PIDS+=($p); names+=($name); ports+=($port); pids+=($p); port=$((port+1))
done
for u in "${ports[@]}"; do for _ in $(seq 100); do curl -fs -o /dev/null "http://127.0.0.1:$u/health" && break; sleep 0.2; done; done
B=${BENCH:-$(dirname "$0")/../../pdserve}  # the bench client: any pdserve binary
[ -x "$B" ] || B=${pids:+$(readlink -f /proc/${pids[0]}/exe)}
for r in $(seq $R); do
  for i in "${!names[@]}"; do
    n=${names[$i]}; u=${ports[$i]}; p=${pids[$i]}
    $B bench --base-url http://127.0.0.1:$u --num-prompts 200 --max-concurrency $C --random-input-len 32 --random-output-len 16 --seed 2 --progress=false >/dev/null 2>&1
    t0=$(ticks $p)
    $B bench --base-url http://127.0.0.1:$u --num-prompts $N --max-concurrency $C --random-input-len 32 --random-output-len 16 --seed 1 --progress=false --output $T/$n.json >/dev/null 2>&1
    t1=$(ticks $p)
    awk -v n="$n" -v c="$C" -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v N=$N -v r="$(jq .runs[0].summary.request_throughput $T/$n.json)" -v e="$(jq .runs[0].summary.e2e.median_ms $T/$n.json)" -v f="$(jq .runs[0].summary.failed $T/$n.json)" \
      'BEGIN { printf "%-8s c=%s req_s=%.0f e2e_p50_ms=%.3f cpu_us_per_req=%.0f failed=%s\n", n, c, r, e, t / hz / N * 1e6, f }'
  done
done
