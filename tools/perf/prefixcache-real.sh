#!/usr/bin/env bash
# The prefix cache on the real model (issue 13): the SmolLM2-135M-shaped
# synthetic checkpoint (tools/perf/synthckpt) served by two `pdserve serve`
# side by side, A with the prefix cache (the default), B with
# --disable-prefix-cache, each idle while the other is measured; prompts of
# a 1,024-token shared prefix + 64 unique tokens (token ids: the checkpoint
# has no tokenizer), 8 output tokens, sent one at a time alternating A, B
# (tools/perf/prefixcache-real.py).
# Usage: tools/perf/prefixcache-real.sh [OUT]  (default docs/perf/prefixcache/real)
# N (prompts per server), PREFIX, SUFFIX override the defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-docs/perf/prefixcache/real}}
N=${N:-6}; PREFIX=${PREFIX:-1024}; SUFFIX=${SUFFIX:-64}
B=/tmp/pdserve-prefixcache
CKPT=${CKPT:-/tmp/pdserve-smollm2-synthetic}
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
[ -f "$CKPT/model.safetensors" ] || go run ./tools/perf/synthckpt "$CKPT"
lscpu | grep -E '^Model name' || true
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap stop_all EXIT
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return; sleep 0.1; done; echo "port $1 not up" >&2; exit 1; }
"$B" serve --port 18501 --model "$CKPT" --kv-cache-memory 512MiB --log-level warn > "$OUT/serve-cache.log" 2>&1 & PIDS+=($!)
"$B" serve --port 18502 --model "$CKPT" --kv-cache-memory 512MiB --log-level warn --disable-prefix-cache > "$OUT/serve-nocache.log" 2>&1 & PIDS+=($!)
wait_up 18501; wait_up 18502
{
  echo "start: $(date -u +%FT%TZ) $(uptime)"
  python3 tools/perf/prefixcache-real.py http://127.0.0.1:18501 http://127.0.0.1:18502 "$N" "$PREFIX" "$SUFFIX" 49152
  echo "end: $(date -u +%FT%TZ) $(uptime)"
} | tee "$OUT/result.txt"
rm -f "$OUT"/*.log
