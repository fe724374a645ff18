#!/usr/bin/env bash
# The planner against static splits on a shifting workload: 4 workers of
# the simulated model (h100-llama3-8b step times) in one `pdserve up`, a
# 10-minute trace of 3 min of 4,096-token prompts / 64-token answers at
# 14 req/s, 3 min of 256 / 1,024 at 6 req/s, then 4 min of the first again,
# replayed by `pdserve bench --trace`. Configurations, one `up` each, one
# after the other: the planner (starting at 2P:2D), 1P:3D, 2P:2D, 3P:1D.
# Reports the fraction of requests within both SLOs per phase, and plots it
# over time with the planner's split.
# Usage: tools/perf/planner.sh [OUT]   (OUT default docs/perf/planner)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/planner}}
CONFIGS=${CONFIGS:-planner 1p3d 2p2d 3p1d}
PHASES=${PHASES:-180s:4096:64:14 180s:256:1024:6 240s:4096:64:14}
SLO_TTFT=${SLO_TTFT:-1s}; SLO_ITL=${SLO_ITL:-20ms}
# 16 sequences per forward: a decode worker streams ~2,500 tokens/s, so
# 6 req/s of 1,024-token answers need three of them and the whole run
# stays within what two cores can stream; one KV head of simulated KV per
# token (the step times come from the profile).
WORKER=(--max-running-requests 16 --sim-kv-heads 1 --log-level info)
PLANNER=(--planner --ttft-slo "$SLO_TTFT" --itl-slo "$SLO_ITL" --planner-interval 1s --planner-window 3s
  --planner-dwell 3s --planner-flip-drain-timeout 1s)
B=/tmp/pdserve-planner
PORT=${PORT:-18940}
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
go build -o "$B-tool" ./tools/perf/plannerbench
lscpu | grep -E '^Model name' || true
phase_args=(); durations=()
for p in $PHASES; do phase_args+=(-phase "$p"); durations+=("${p%%:*}"); done
"$B-tool" trace "${phase_args[@]}" > "$OUT/shift.jsonl"
UP=""
trap '[ -n "$UP" ] && kill -INT "$UP" 2>/dev/null; wait 2>/dev/null || true' EXIT
reports=(); splits=()
for c in $CONFIGS; do
  case $c in
  planner) args=(--prefill-workers 2 --decode-workers 2 "${PLANNER[@]}") ;;
  [0-9]p[0-9]d) args=(--prefill-workers "${c:0:1}" --decode-workers "${c:2:1}") ;;
  *) echo "unknown configuration $c" >&2; exit 2 ;;
  esac
  "$B" up --port "$PORT" "${WORKER[@]}" "${args[@]}" > "$OUT/$c.up.log" 2>&1 & UP=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
  echo "== $c (load $(cut -d' ' -f1-3 /proc/loadavg))"
  : > "$OUT/$c.split.csv"
  ( t0=$(date +%s.%N)
    while kill -0 "$UP" 2>/dev/null; do
      now=$(date +%s.%N)
      if j=$(curl -sf "http://127.0.0.1:$PORT/planner"); then
        echo "$(echo "$now - $t0" | bc),$(echo "$j" | jq -r '"\(.last.prefill),\(.last.decode)"')"
      elif [ "$c" != planner ]; then
        echo "$(echo "$now - $t0" | bc),${c:0:1},${c:2:1}"
      fi
      sleep 2
    done >> "$OUT/$c.split.csv" ) &
  sampler=$!
  "$B" bench --base-url "http://127.0.0.1:$PORT" --trace "$OUT/shift.jsonl" --slo-ttft "$SLO_TTFT" --slo-tpot "$SLO_ITL" \
    --output "$OUT/$c.json" --progress=false > "$OUT/$c.bench.txt" 2>&1
  kill -INT "$UP"; wait "$UP" 2>/dev/null || true; UP=""
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  reports+=("$c=$OUT/$c.json"); splits+=(-split "$c=$OUT/$c.split.csv")
  grep -E "Successful|Failed|Shed|Goodput|Median TTFT|P99 TTFT|Mean TPOT" "$OUT/$c.bench.txt" || true
done
IFS=,; phases_csv="${durations[*]}"; unset IFS
"$B-tool" report -phases "$phases_csv" -plot "$OUT" "${splits[@]}" "${reports[@]}" | tee "$OUT/table.md"
grep -h "planner decision" "$OUT/planner.up.log" | grep -v "action=hold" > "$OUT/planner-changes.log" || true
