#!/usr/bin/env bash
# Prefix cache and cache-aware pairing (issue 13's goals): 2 prefill + 2
# decode workers on the simulated model with the h100-llama3-8b profile behind
# one router, restarted for every configuration so each starts with cold
# caches:
#   nocache      the workers with --disable-prefix-cache, least_load pairing
#   round_robin  the cache on, round_robin pairing (both roles)
#   cache_aware  the cache on, cache_aware pairing (both roles)
# Workload 1 (shared-prefix): 16 prefixes of 2,048 tokens, 128-token unique
# suffixes, 128 output tokens. Workload 2 (multi-turn): 8-turn chats, a new
# 256-token message and 128 output tokens a turn; the prefill workers' KV
# bytes sent are scraped before and after it.
# Usage: tools/perf/prefixcache.sh [OUT]   (OUT default docs/perf/prefixcache)
# CONFIGS, PROMPTS, RATE, CONVS, TURNS, CHAT_RATE override the defaults; CHAT_FLAGS adds
# bench flags to the multi-turn run (e.g. --ignore-eos=false), ROUTER_FLAGS router flags
# (e.g. --cache-aware-weight 4). WORKER_FLAGS adds flags to every worker, PREFILL_FLAGS and
# DECODE_FLAGS to one role's (after WORKER_FLAGS, so they win), e.g. PREFILL_FLAGS="--kv-cache-memory
# 80MiB" for a pool that holds only part of the 16 prefixes. WORKLOADS (default "shared chat") picks
# the workloads; the workers' KV page and eviction counters are scraped after the shared-prefix run.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/prefixcache}}
CONFIGS=${CONFIGS:-nocache round_robin cache_aware}
PROMPTS=${PROMPTS:-512}
RATE=${RATE:-8}
CONVS=${CONVS:-32}
TURNS=${TURNS:-8}
CHAT_RATE=${CHAT_RATE:-2}
WORKLOADS=${WORKLOADS:-shared chat}
WORKER_FLAGS=${WORKER_FLAGS:-}
PREFILL_FLAGS=${PREFILL_FLAGS:-}
DECODE_FLAGS=${DECODE_FLAGS:-}
SLO=(--slo-ttft "${SLO_TTFT:-1s}" --slo-tpot "${SLO_TPOT:-50ms}")
SIM=(--sim-profile h100-llama3-8b --log-level warn)
B=/tmp/pdserve-prefixcache
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
lscpu | grep -E '^Model name' || true
echo "start: $(date -u +%FT%TZ) $(uptime)"
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap stop_all EXIT
wait_up() { for _ in $(seq 200); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return; sleep 0.1; done; echo "port $1 not up" >&2; exit 1; }
# kv_sent sums pdserve_kv_transfer_bytes_total{direction="sent"} over the prefill workers.
kv_sent() {
  for p in 18940 18941; do curl -s "http://127.0.0.1:$p/metrics"; done |
    awk '/^pdserve_kv_transfer_bytes_total\{.*direction="sent"/ {s += $2} END {printf "%.0f\n", s}'
}
start_fleet() { # $1: worker flags, $2: policy
  local wf=($1 $WORKER_FLAGS) pf=($PREFILL_FLAGS) df=($DECODE_FLAGS)
  "$B" prefill --port 18940 --kv-port 18950 "${SIM[@]}" "${wf[@]}" "${pf[@]}" > "$OUT/p0.log" 2>&1 & PIDS+=($!)
  "$B" prefill --port 18941 --kv-port 18951 "${SIM[@]}" "${wf[@]}" "${pf[@]}" > "$OUT/p1.log" 2>&1 & PIDS+=($!)
  "$B" decode --port 18942 "${SIM[@]}" "${wf[@]}" "${df[@]}" > "$OUT/d0.log" 2>&1 & PIDS+=($!)
  "$B" decode --port 18943 "${SIM[@]}" "${wf[@]}" "${df[@]}" > "$OUT/d1.log" 2>&1 & PIDS+=($!)
  for p in 18940 18941 18942 18943; do wait_up $p; done
  "$B" router --port 18949 --prefill http://127.0.0.1:18940,http://127.0.0.1:18941 \
    --decode http://127.0.0.1:18942,http://127.0.0.1:18943 --prefill-policy "$2" --decode-policy "$2" \
    "${SIM[@]}" ${ROUTER_FLAGS:-} > "$OUT/router.log" 2>&1 & PIDS+=($!)
  wait_up 18949
  sleep 2 # every worker ready (two passing health checks)
}
for cfg in $CONFIGS; do
  case $cfg in
    nocache) wflags=--disable-prefix-cache; pol=least_load ;;
    *) wflags=; pol=$cfg ;;
  esac
  if [[ " $WORKLOADS " == *" shared "* ]]; then
  echo "== $cfg: shared prefix"
  start_fleet "$wflags" "$pol"
  "$B" bench --base-url http://127.0.0.1:18949 --dataset shared-prefix --num-prefixes 16 --shared-prefix-len 2048 \
    --suffix-len 128 --random-output-len 128 --num-prompts "$PROMPTS" --request-rate "$RATE" --seed 1 "${SLO[@]}" \
    --progress=false --output "$OUT/shared-$cfg.json" > "$OUT/shared-$cfg.txt"
  curl -s http://127.0.0.1:18949/metrics | grep -E '^pdserve_router_(selections|prefix_.*)_total' > "$OUT/router-$cfg.metrics" || true
  for p in 18940 18941 18942 18943; do curl -s "http://127.0.0.1:$p/metrics" |
    sed -n "s#^\(pdserve_\(kv_pages\|prefix_cache_[a-z_]*total\){.*}\)#$p \1#p"; done > "$OUT/shared-$cfg.cache.metrics"
  stop_all
  fi
  [[ " $WORKLOADS " == *" chat "* ]] || continue
  echo "== $cfg: multi-turn"
  start_fleet "$wflags" "$pol"
  before=$(kv_sent)
  "$B" bench --base-url http://127.0.0.1:18949 --endpoint chat --multi-turn "$TURNS" --num-prompts "$CONVS" \
    --random-input-len 256 --random-output-len 128 --request-rate "$CHAT_RATE" --seed 1 --warmup 0 \
    ${CHAT_FLAGS:-} --progress=false --output "$OUT/chat-$cfg.json" > "$OUT/chat-$cfg.txt"
  echo $(( $(kv_sent) - before )) > "$OUT/chat-$cfg.kvbytes"
  for p in 18940 18941 18942 18943; do curl -s "http://127.0.0.1:$p/metrics" | sed -n "s|^\(pdserve_prefix_cache_[a-z_]*total{.*}\)|$p \1|p"; done > "$OUT/chat-$cfg.cache.metrics"
  stop_all
done
{
  if [[ " $WORKLOADS " == *" shared "* ]]; then
  echo "| config | p50 TTFT (ms) | p90 TTFT (ms) | goodput (req/s) | hit rate | of oracle |"
  echo "|---|---|---|---|---|---|"
  for cfg in $CONFIGS; do
    jq -r --arg c "$cfg" '.runs[0].summary | "| \($c) | \(.ttft.median_ms|floor) | \(.ttft.p90_ms|floor) | \(.goodput.requests_per_s*100|floor/100) | \(.prefix_cache.hit_rate // 0 | .*1000|floor/10)% | \(.prefix_cache.hit_rate_of_oracle // 0 | .*1000|floor/10)% |"' "$OUT/shared-$cfg.json"
  done
  fi
  [[ " $WORKLOADS " == *" chat "* ]] || exit 0
  echo
  echo "| config | $TURNS-turn chat: KV bytes sent | turn 1 prompt tokens | turns 2-$TURNS hit rate |"
  echo "|---|---|---|---|"
  for cfg in $CONFIGS; do
    jq -r --arg c "$cfg" --arg kv "$(cat "$OUT/chat-$cfg.kvbytes")" '.runs[0].summary.turns as $t |
      "| \($c) | \($kv) | \($t[0].input_tokens) | \(([$t[1:][].cached_tokens] | add) / ([$t[1:][].input_tokens] | add) * 1000 | floor / 10)% |"' "$OUT/chat-$cfg.json"
  done
} | tee "$OUT/table.md"
echo "end: $(date -u +%FT%TZ) $(uptime)" | tee -a "$OUT/table.md"
rm -f "$OUT"/*.log
