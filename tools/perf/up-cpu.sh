#!/usr/bin/env bash
# Two `pdserve up` (binaries A and B, simulated model with no step time, tiny
# KV) side by side, the shared script's concurrency-64 traffic (3,000
# requests, 32-token prompts, 16 output tokens) sent to each in turn, ROUNDS
# times: requests/s and the up process's CPU per request (router and both
# workers; user + system from /proc/PID/stat).
# Usage: tools/perf/up-cpu.sh ROUNDS A B
set -euo pipefail
R=$1; A=$2; B=$3; T=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
SIM=(--sim-profile none --sim-layers 2 --sim-kv-heads 1 --sim-head-dim 16)
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
PA=$(fp); PB=$(fp)
"$A" up --port "$PA" "${SIM[@]}" >"$T/a.log" 2>&1 & PIDA=$!; PIDS+=($PIDA)
"$B" up --port "$PB" "${SIM[@]}" >"$T/b.log" 2>&1 & PIDB=$!; PIDS+=($PIDB)
for u in $PA $PB; do for _ in $(seq 100); do curl -fs -o /dev/null "http://127.0.0.1:$u/health" && break; sleep 0.2; done; done
lscpu | grep -E '^Model name' || true
run() { # name port pid
  "$A" bench --base-url "http://127.0.0.1:$2" --num-prompts 200 --max-concurrency 64 --random-input-len 32 \
    --random-output-len 16 --seed 2 --progress=false >/dev/null 2>&1 # warm connections
  local t0 t1; t0=$(ticks "$3")
  "$A" bench --base-url "http://127.0.0.1:$2" --num-prompts 3000 --max-concurrency 64 --random-input-len 32 \
    --random-output-len 16 --seed 1 --progress=false --output "$T/$1.json" >/dev/null 2>&1
  t1=$(ticks "$3")
  awk -v n="$1" -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v r="$(jq .runs[0].summary.request_throughput "$T/$1.json")" \
    'BEGIN { printf "%-3s req_s=%.0f cpu_us_per_req=%.0f\n", n, r, t / hz / 3000 * 1e6 }'
}
for _ in $(seq "$R"); do run A "$PA" "$PIDA"; run B "$PB" "$PIDB"; done
