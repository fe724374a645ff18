#!/usr/bin/env bash
# TTFT at low load (one request at a time): PD (1 prefill + 1 decode) versus
# one colocated worker, on the simulated model with the H100 profile, and
# how chunked prefill lets the KV stream to decode while the prompt is
# still being computed. Usage: tools/perf/ttft.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/ttft}}
PROMPTS=${PROMPTS:-40}
mkdir -p "$OUT"
go build -o /tmp/pdserve-perf ./cmd/pdserve
WORKLOAD=(--random-input-len 4096 --random-output-len 8 --request-rate 2 --max-concurrency 1 --num-prompts "$PROMPTS" --seed 1)
run() { # name port up-args...
  local name=$1 port=$2; shift 2
  /tmp/pdserve-perf up --port "$port" --log-level warn "$@" > "$OUT/$name.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  /tmp/pdserve-perf bench --base-url "http://127.0.0.1:$port" "${WORKLOAD[@]}" --progress=false \
    --output "$OUT/$name.json" | tee "$OUT/$name.txt" | grep -E "TTFT"
  kill -INT "$pid"; wait "$pid" || true
}
# 1. Low-load TTFT overhead of PD (tiny simulated KV, so only the GPU-like
#    step times and pdserve's own path count).
SMALL=(--sim-profile h100-llama3-8b --sim-layers 2 --sim-kv-heads 2 --sim-head-dim 16)
echo "== colocated, small KV"; run colocated-small 18710 "${SMALL[@]}" --colocated-workers 1
echo "== PD, small KV";        run pd-small 18711 "${SMALL[@]}"
# 2. Moving real amounts of KV (8 layers × 8 KV heads × 128 × bf16 = 32 KiB
#    per token, 128 MiB for a 4096-token prompt) over loopback: the whole
#    prompt in one forward, then all of its KV; or 512-token chunks, each
#    streamed while the next is computed.
BIG=(--sim-profile h100-llama3-8b --sim-layers 8 --sim-kv-heads 8 --sim-head-dim 128)
echo "== PD, 32 KiB/token, one chunk";   run pd-big-whole 18712 "${BIG[@]}" --chunked-prefill-size 8192
echo "== PD, 32 KiB/token, 512 chunks";  run pd-big-chunked 18713 "${BIG[@]}" --chunked-prefill-size 512
echo "== colocated, 32 KiB/token";       run colocated-big 18714 "${BIG[@]}" --colocated-workers 1
rm -f "$OUT"/*.server.log
