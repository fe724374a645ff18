#!/usr/bin/env bash
# The planner with cache-aware pairing and per-request disaggregation
# against static splits with round_robin, on a Mooncake FAST'25 trace:
# 4 workers of the simulated model (h100-llama3-8b step times) in one
# `pdserve up`, the trace replayed by `pdserve bench --trace`, goodput
# (requests/s within both SLOs) per configuration.
# Usage: TRACE=conversation_trace.jsonl tools/perf/planner-trace.sh [OUT]
#   (OUT default docs/perf/planner-trace; fetch the trace from
#   kvcache-ai/Mooncake FAST25-release/traces/)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/planner-trace}}
TRACE=${TRACE:?set TRACE to a Mooncake trace file}
CONFIGS=${CONFIGS:-smart 1p3d 2p2d 3p1d}
SCALE=${SCALE:-1}; DURATION=${DURATION:-60s}
SLO_TTFT=${SLO_TTFT:-5s}; SLO_ITL=${SLO_ITL:-50ms}
WORKER=(--sim-kv-heads 1 --sim-context-len 131072 --log-level info)
SMART=(--prefill-workers 2 --decode-workers 2 --planner --ttft-slo "$SLO_TTFT" --itl-slo "$SLO_ITL"
  --planner-interval 1s --planner-window 5s --planner-dwell 5s --planner-flip-drain-timeout 5s
  --prefill-policy cache_aware --decode-policy cache_aware --disagg-min-prompt-tokens 512)
B=/tmp/pdserve-planner-trace
PORT=${PORT:-18960}
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
lscpu | grep -E '^Model name' || true
UP=""
trap '[ -n "$UP" ] && kill -INT "$UP" 2>/dev/null; wait 2>/dev/null || true' EXIT
for c in $CONFIGS; do
  case $c in
  smart) args=("${SMART[@]}") ;;
  [0-9]p[0-9]d) args=(--prefill-workers "${c:0:1}" --decode-workers "${c:2:1}" --prefill-policy round_robin --decode-policy round_robin) ;;
  *) echo "unknown configuration $c" >&2; exit 2 ;;
  esac
  "$B" up --port "$PORT" "${WORKER[@]}" "${args[@]}" > "$OUT/$c.up.log" 2>&1 & UP=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
  echo "== $c (load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$B" bench --base-url "http://127.0.0.1:$PORT" --trace "$TRACE" --trace-time-scale "$SCALE" --trace-duration "$DURATION" \
    --seed 1 --slo-ttft "$SLO_TTFT" --slo-tpot "$SLO_ITL" --output "$OUT/$c.json" --progress=false > "$OUT/$c.bench.txt" 2>&1
  kill -INT "$UP"; wait "$UP" 2>/dev/null || true; UP=""
  grep -E "Successful|Failed|Shed requests|Goodput \(req|Goodput fraction|Median TTFT|P90 TTFT|Mean TPOT|Prefix cache hit" "$OUT/$c.bench.txt" || true
done
