#!/usr/bin/env bash
# PD (1 prefill + 1 decode) versus 2 colocated workers at equal worker count,
# on the simulated model with a GPU-like latency profile (Llama-3-8B on one
# H100 per worker, see internal/model/sim/profile.go), swept over request
# rates with pdserve bench. Writes JSON and plots under OUT (default
# docs/perf/pd-vs-colocated). Usage: tools/perf/pd-vs-colocated.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/pd-vs-colocated}}
RATES=${RATES:-1,2,3,4,5,6,7,8,9}
PROMPTS=${PROMPTS:-200}
# Long prompts, short answers (summarization-like, as in DistServe's
# LongBench runs): 4096 ± 25% prompt tokens, 128 output tokens.
WORKLOAD=(--random-input-len 4096 --random-range-ratio 0.25 --random-output-len 128)
SLO=(--slo-ttft "${SLO_TTFT:-2s}" --slo-tpot "${SLO_TPOT:-12ms}")
# The simulated KV is small (the GPU time comes from the profile), so the
# CPU cost of moving it stays out of the comparison.
SIM=(--sim-profile h100-llama3-8b --sim-layers 2 --sim-kv-heads 2 --sim-head-dim 16 --sim-context-len 8192 --log-level warn)
mkdir -p "$OUT"
go build -o /tmp/pdserve-perf ./cmd/pdserve
run() { # name port up-args...
  local name=$1 port=$2; shift 2
  /tmp/pdserve-perf up --port "$port" "${SIM[@]}" "$@" > "$OUT/$name.server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  /tmp/pdserve-perf bench --base-url "http://127.0.0.1:$port" --num-prompts "$PROMPTS" --request-rate "$RATES" \
    --seed 1 "${WORKLOAD[@]}" "${SLO[@]}" --progress=false \
    --output "$OUT/$name.json" --plot "$OUT/$name" | tee "$OUT/$name.txt"
  kill -INT "$pid"; wait "$pid" || true
}
run pd 18700
run colocated 18701 --colocated-workers 2
run colocated-chunked 18702 --colocated-workers 2 --chunked-prefill-size 512
go run ./tools/perf/compare -strip -out "$OUT" "PD 1P1D=$OUT/pd.json" "colocated ×2=$OUT/colocated.json" \
  "colocated ×2, chunked 512=$OUT/colocated-chunked.json" | tee "$OUT/table.md"
rm -f "$OUT"/*.server.log
