#!/usr/bin/env bash
# Pair policies on an unequal fleet: 2 prefill + 2 decode workers on the
# simulated model with the h100-llama3-8b profile, one decode worker with half
# the other's KV pool, behind one router; round_robin against least_load (both
# roles), in the same run, on the same workers, swept over request rates with
# pdserve bench. Reports p90 TTFT, p90 TPOT, goodput and 429s (shed) per rate.
# Usage: tools/perf/pairing.sh [OUT]   (OUT default docs/perf/pairing)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/pairing}}
RATES=${RATES:-4,8,12,16,20,24}
PROMPTS=${PROMPTS:-150}
POLICIES=${POLICIES:-round_robin least_load}
# 1024 ± 25% prompt tokens, 128 output tokens; 256 B of simulated KV per token
# (the step times come from the profile; small KV keeps the CPU for serving).
WORKLOAD=(--random-input-len 1024 --random-range-ratio 0.25 --random-output-len 128)
SLO=(--slo-ttft "${SLO_TTFT:-500ms}" --slo-tpot "${SLO_TPOT:-20ms}")
SIM=(--sim-profile h100-llama3-8b --sim-layers 2 --sim-kv-heads 2 --sim-head-dim 16 --sim-context-len 8192 --log-level warn)
# d0 holds 16384 tokens of KV (about 14 requests), d1 half of that.
D0_KV=${D0_KV:-4MiB}; D1_KV=${D1_KV:-2MiB}
B=/tmp/pdserve-pairing
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
lscpu | grep -E '^Model name' || true
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
wait_up() { for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return; sleep 0.1; done; echo "port $1 not up" >&2; exit 1; }
"$B" prefill --port 18920 --kv-port 18930 --kv-cache-memory 64MiB "${SIM[@]}" > "$OUT/p0.log" 2>&1 & PIDS+=($!)
"$B" prefill --port 18921 --kv-port 18931 --kv-cache-memory 64MiB "${SIM[@]}" > "$OUT/p1.log" 2>&1 & PIDS+=($!)
"$B" decode --port 18922 --kv-cache-memory "$D0_KV" "${SIM[@]}" > "$OUT/d0.log" 2>&1 & PIDS+=($!)
"$B" decode --port 18923 --kv-cache-memory "$D1_KV" "${SIM[@]}" > "$OUT/d1.log" 2>&1 & PIDS+=($!)
for p in 18920 18921 18922 18923; do wait_up $p; done
for pol in $POLICIES; do
  "$B" router --port 18929 --prefill http://127.0.0.1:18920,http://127.0.0.1:18921 \
    --decode http://127.0.0.1:18922,http://127.0.0.1:18923 --prefill-policy "$pol" --decode-policy "$pol" \
    "${SIM[@]}" > "$OUT/router-$pol.log" 2>&1 &
  rp=$!
  wait_up 18929
  sleep 2 # both decode workers ready (two passing health checks)
  echo "== $pol"
  "$B" bench --base-url http://127.0.0.1:18929 --num-prompts "$PROMPTS" --request-rate "$RATES" --seed 1 \
    "${WORKLOAD[@]}" "${SLO[@]}" --progress=false --output "$OUT/$pol.json" > "$OUT/$pol.txt"
  curl -s http://127.0.0.1:18929/metrics | grep -E '^pdserve_router_(selections|shed)_total' > "$OUT/router-$pol.metrics" || true
  kill -INT "$rp"; wait "$rp" || true
done
{
  echo "| policy | rate (req/s) | p90 TTFT (ms) | p90 TPOT (ms) | goodput (req/s) | goodput fraction | shed (429) | failed |"
  echo "|---|---|---|---|---|---|---|---|"
  for pol in $POLICIES; do
    jq -r --arg p "$pol" '.runs[].summary | "| \($p) | \(.request_rate) | \(.ttft.p90_ms|floor) | \(.tpot.p90_ms*10|floor/10) | \(.goodput.requests_per_s*100|floor/100) | \(.goodput.fraction*100|floor/100) | \(.shed) | \(.failed) |"' "$OUT/$pol.json"
  done
} | tee "$OUT/table.md"
for pol in $POLICIES; do echo "$pol: first rate with a 429: $(jq -r '[.runs[].summary | select(.shed > 0) | .request_rate] | first // "none"' "$OUT/$pol.json")"; done | tee -a "$OUT/table.md"
# Plots, and the JSON without its per-request records.
go run ./tools/perf/compare -strip -out "$OUT" $(for pol in $POLICIES; do echo "$pol=$OUT/$pol.json"; done) > "$OUT/compare.md"
rm -f "$OUT"/*.log
