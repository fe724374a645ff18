#!/usr/bin/env bash
# Rolling restart under load: 2 prefill + 2 decode workers behind a router
# (static membership, fixed ports), `pdserve bench` at a steady rate with
# streaming requests of several seconds, and every worker restarted once,
# one at a time: SIGTERM, wait for it to exit (it drains), start it again,
# wait until the router has it ready. Prints the bench summary, how long each
# drain took, and p99 TTFT of the requests sent before and during the
# restarts, and the requests the router continued on another pair after a
# worker failed under them (its drain timed out). Needs jq.
#
#   tools/perf/rolling-restart.sh [rate] [num-prompts] [output-tokens] [drain-timeout]
#
# output-tokens (64) × 60 ms is how long a stream lasts; drain-timeout (60s)
# is the workers' --drain-timeout. With streams longer than the drain
# timeout (1000 and 5s: 60 s streams), each decode worker's drain is cut and
# the router continues its streams on the other decode worker.
set -euo pipefail
cd "$(dirname "$0")/../.."
rate=${1:-4}
n=${2:-240}
outlen=${3:-64}
drain=${4:-60s}
out=${OUT:-/tmp/pdserve-rolling}
mkdir -p "$out"
go build -o "$out/pdserve" ./cmd/pdserve
bin="$out/pdserve"
# 60 ms per decode step and 64 output tokens: each stream lasts ~4 s.
sim=(--sim-layers 2 --sim-kv-heads 2 --sim-head-dim 16 --sim-prefill-ms-per-token 0.05 --sim-decode-ms-per-step 60)
common=(--host 127.0.0.1 --kv-cache-memory 256MiB --drain-timeout "$drain" "${sim[@]}")
declare -A port=([prefill-0]=31000 [prefill-1]=31001 [decode-0]=31010 [decode-1]=31011)
declare -A kv=([prefill-0]=31100 [prefill-1]=31101)
declare -A pid
start() { # name
  local name=$1 role=${1%-*} args=()
  [[ $role == prefill ]] && args=(--kv-port "${kv[$name]}")
  "$bin" "$role" --port "${port[$name]}" "${args[@]}" "${common[@]}" >"$out/$name.log" 2>&1 &
  pid[$name]=$!
  until grep -qs '^ready$' "$out/$name.log"; do sleep 0.1; done
}
cleanup() { kill "${pid[@]}" "${rpid:-}" 2>/dev/null || true; }
trap cleanup EXIT
for w in prefill-0 prefill-1 decode-0 decode-1; do start "$w"; done
"$bin" router --port 31200 --prefill http://127.0.0.1:31000,http://127.0.0.1:31001 \
  --decode http://127.0.0.1:31010,http://127.0.0.1:31011 --health-interval 250ms "${sim[@]}" >"$out/router.log" 2>&1 &
rpid=$!
until grep -qs '^ready$' "$out/router.log"; do sleep 0.1; done
ready() { # url: wait until the router lists it ready
  until curl -s http://127.0.0.1:31200/workers | jq -e --arg u "$1" '.workers[] | select(.url == $u and .state == "ready")' >/dev/null; do
    sleep 0.1
  done
}

t0=$(date +%s.%N)
"$bin" bench --base-url http://127.0.0.1:31200 --num-prompts "$n" --request-rate "$rate" --random-input-len 256 \
  --random-output-len "$outlen" --warmup 0 --progress=false --output "$out/bench.json" >"$out/bench.txt" 2>&1 &
bpid=$!
sleep 15
rs=$(echo "$(date +%s.%N) - $t0" | bc)
echo "worker      SIGTERM to exit   back ready after"
for w in prefill-0 decode-0 prefill-1 decode-1; do
  s=$(date +%s.%N)
  kill -TERM "${pid[$w]}"
  wait "${pid[$w]}" || { echo "$w exited with $?"; exit 1; }
  e=$(date +%s.%N)
  start "$w"
  ready "http://127.0.0.1:${port[$w]}"
  r=$(date +%s.%N)
  printf '%-11s %8.2f s          %6.2f s\n' "$w" "$(echo "$e - $s" | bc)" "$(echo "$r - $e" | bc)"
done
re=$(echo "$(date +%s.%N) - $t0" | bc)
wait "$bpid" || true
cat "$out/bench.txt"
p99() { jq -r --argjson a "$1" --argjson b "$2" \
  '[.runs[0].requests[] | select(.success and .sent_s >= $a and .sent_s < $b) | .ttft_ms] | sort | if length == 0 then "n/a" else .[((length * 99 / 100) | floor)] end' \
  "$out/bench.json"; }
echo "restarts from ${rs}s to ${re}s of the run"
echo "p99 TTFT before: $(p99 0 "$rs") ms, during: $(p99 "$rs" "$re") ms, after: $(p99 "$re" 1e9) ms"
echo "failed requests: $(jq '[.runs[0].requests[] | select(.success | not)] | length' "$out/bench.json") of $(jq '.runs[0].requests | length' "$out/bench.json")"
migrations=$(curl -s http://127.0.0.1:31200/metrics | awk '/^pdserve_router_migrations_total[{ ]/ { n += $NF; if ($NF > 0) by = by " " $1 "=" $NF } END { print n + 0 by }')
echo "requests continued on another pair (pdserve_router_migrations_total): $migrations"
