#!/usr/bin/env bash
# The prefix cache's cost at a 0% hit rate (issue 13): two `pdserve up` of the
# default simulated model side by side, A with the cache (the default) and B
# with --disable-prefix-cache, each idle while the other is measured; random
# prompts (unique: each seed is sent once to each server, so no prompt is ever
# seen twice by one server), all at once with at most 64 in flight, alternated
# A B, B A, A B. Prints requests/s and output tok/s per run and the ratio.
# Usage: tools/perf/prefixcache-overhead.sh [OUT]  (default docs/perf/prefixcache/overhead)
# PROMPTS, INPUT, OUTPUT, CONC override the defaults; UP_FLAGS adds `up` flags; WARM=N first
# sends N unmeasured prompts to each server (enough to cycle its KV pool: see docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/prefixcache/overhead}}
PROMPTS=${PROMPTS:-400}
INPUT=${INPUT:-1024}
OUTPUT=${OUTPUT:-32}
CONC=${CONC:-64}
B=/tmp/pdserve-prefixcache
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
lscpu | grep -E '^Model name' || true
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap stop_all EXIT
# minflt is a process's minor page faults so far (/proc/PID/stat field 10).
minflt() { awk '{print $10}' "/proc/$1/stat"; }
wait_up() { for _ in $(seq 200); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return; sleep 0.1; done; echo "port $1 not up" >&2; exit 1; }
"$B" up --port 18401 --log-level warn ${UP_FLAGS:-} > "$OUT/up-cache.log" 2>&1 & PIDS+=($!)
"$B" up --port 18402 --log-level warn --disable-prefix-cache ${UP_FLAGS:-} > "$OUT/up-nocache.log" 2>&1 & PIDS+=($!)
wait_up 18401; wait_up 18402; sleep 2
run() { # $1 name, $2 port, $3 seed
  echo "$(date -u +%T) $1 seed $3: $(uptime | sed 's/.*load/load/'); minor faults so far: cache $(minflt "${PIDS[0]}"), no cache $(minflt "${PIDS[1]}")" >> "$OUT/load.txt"
  "$B" bench --base-url "http://127.0.0.1:$2" --num-prompts "$PROMPTS" --request-rate inf --max-concurrency "$CONC" \
    --random-input-len "$INPUT" --random-output-len "$OUTPUT" --seed "$3" --progress=false \
    --output "$OUT/$1-$3.json" > "$OUT/$1-$3.txt"
}
: > "$OUT/load.txt"
if (( ${WARM:-0} > 0 )); then # fill each pool once (unmeasured), so that both reuse touched pages
  for srv in "cache 18401" "nocache 18402"; do set -- $srv
    "$B" bench --base-url "http://127.0.0.1:$2" --num-prompts "$WARM" --request-rate inf --max-concurrency "$CONC" \
      --random-input-len "$INPUT" --random-output-len "$OUTPUT" --seed 100 --progress=false > "$OUT/warm-$1.txt"
  done
fi
for s in 1 2 3; do
  if (( s % 2 )); then run cache 18401 $s; run nocache 18402 $s; else run nocache 18402 $s; run cache 18401 $s; fi
done
{
  echo "| seed | cache req/s | no cache req/s | ratio | cache hit rate |"
  echo "|---|---|---|---|---|"
  for s in 1 2 3; do
    c=$(jq '.runs[0].summary.request_throughput' "$OUT/cache-$s.json"); n=$(jq '.runs[0].summary.request_throughput' "$OUT/nocache-$s.json")
    h=$(jq '.runs[0].summary.prefix_cache.hit_rate // 0' "$OUT/cache-$s.json")
    awk -v s=$s -v c=$c -v n=$n -v h=$h 'BEGIN { printf "| %d | %.2f | %.2f | %.3f | %.2f%% |\n", s, c, n, c / n, h * 100 }'
  done
} | tee "$OUT/table.md"
cat "$OUT/load.txt"
rm -f "$OUT"/*.log
