#!/usr/bin/env bash
# Optimistic prefill at low load, when decode is slow to open rooms: TTFT
# with --optimistic-prefill-attempts 1 versus 0 (off), one request at a
# time, on the simulated model with the H100 profile (4096-token prompts:
# ~120 ms of prefill) and a decode worker that admits every leg late by
# each of DELAYS (--test-decode-admission-delay, a busy decode; 0s is the
# control). Runs alternate off/on ROUNDS times per delay, so drift on a
# shared machine hits both alike.
# Usage: tools/perf/optimistic.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/optimistic}}
PROMPTS=${PROMPTS:-30}
ROUNDS=${ROUNDS:-3}
DELAYS=${DELAYS:-0s 100ms 300ms}
mkdir -p "$OUT"
go build -o /tmp/pdserve-perf ./cmd/pdserve
WORKLOAD=(--random-input-len 4096 --random-output-len 8 --request-rate 2 --max-concurrency 1 --num-prompts "$PROMPTS" --seed 1)
SIM=(--sim-profile h100-llama3-8b --sim-layers 2 --sim-kv-heads 2 --sim-head-dim 16 --sim-dtype bf16 --sim-context-len 8192
  --kv-cache-memory 2GiB --chunked-prefill-size 8192)
run() { # name port up-args...
  local name=$1 port=$2; shift 2
  /tmp/pdserve-perf up --port "$port" --log-level warn "${SIM[@]}" "$@" > "$OUT/$name.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  /tmp/pdserve-perf bench --base-url "http://127.0.0.1:$port" "${WORKLOAD[@]}" --progress=false \
    --output "$OUT/$name.json" > "$OUT/$name.txt"
  grep -E "Median TTFT|P90 TTFT" "$OUT/$name.txt" | sed "s/^/$name: /"
  # What the prefill worker did optimistically (sent = computed before the room opened).
  local pw
  pw=$(grep -o 'prefill worker http://[0-9.:]*' "$OUT/$name.server.log" | head -1 | cut -d' ' -f3)
  curl -s "$pw/metrics" | grep '^pdserve_optimistic_prefill_total' | tr '\n' ' ' > "$OUT/$name.optimistic.txt"
  sed "s/^/$name: /" "$OUT/$name.optimistic.txt"; echo
  kill -INT "$pid"; wait "$pid" || true
}
for delay in $DELAYS; do
  for i in $(seq "$ROUNDS"); do
    run "delay$delay-off-$i" 18720 --test-decode-admission-delay "$delay" --optimistic-prefill-attempts 0
    run "delay$delay-on-$i" 18721 --test-decode-admission-delay "$delay" --optimistic-prefill-attempts 1
  done
done
rm -f "$OUT"/*.server.log
