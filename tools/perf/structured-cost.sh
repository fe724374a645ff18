#!/usr/bin/env bash
# What json_schema decoding costs on the real model at batch 16 (issue 26):
# the SmolLM2-135M-shaped synthetic checkpoint with the Llama 3 tokenizer's
# 128,256-token vocabulary (tools/perf/synthckpt -tokenizer) served by one
# `pdserve serve`; `pdserve bench` sends the same chat prompts (random
# dataset, --seed 1, 64-token prompts, max_tokens 128, ignore_eos, greedy)
# at concurrency 16, alternating runs without a constraint (A), with the
# response_format of tools/perf/structured/contact.json (B: six fields,
# strings, integers, an enum, an array of strings) and with
# contact-bounded.json (C: the same with maxLength, maxItems and integer
# ranges, so that the output walks every field and ends with EOS), and D.
# The random weights keep a greedy B inside its first string (the JSON is
# never complete), so A and B produce max_tokens each; C ends with EOS
# after about 56 tokens, so D, unconstrained with max_tokens 56, is C's
# baseline (same output length, so the same share of prefill and of
# requests starting and ending per output token).
# The server's CPU time (utime + stime of /proc/PID/stat) is read before
# and after each run: CPU milliseconds per output token move much less
# with other load on the machine than wall-clock tokens/s do.
# Usage: tools/perf/structured-cost.sh [OUT]  (default /tmp/pdserve-structured-cost)
# ROUNDS (default 3), N (prompts per run, default 32) override the defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-/tmp/pdserve-structured-cost}}
ROUNDS=${ROUNDS:-3}; N=${N:-32}; PORT=${PORT:-18511}
B=/tmp/pdserve-structured-cost-bin
CKPT=${CKPT:-/tmp/pdserve-smollm2-llama3-vocab}
mkdir -p "$OUT"
go build -o "$B" ./cmd/pdserve
[ -f "$CKPT/model.safetensors" ] || go run ./tools/perf/synthckpt -tokenizer internal/model/tokenizer/testdata/llama3 "$CKPT"
grep -m1 '^model name' /proc/cpuinfo || true
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap stop_all EXIT
"$B" serve --port "$PORT" --model "$CKPT" --kv-cache-memory 1GiB --log-level warn ${PPROF:+--pprof-addr "$PPROF"} > "$OUT/serve.log" 2>&1 & PIDS+=($!)
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
SERVE_PID=${PIDS[0]}
TICK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVE_PID/stat"; }
bench() { # NAME [--response-format FILE]
  local name=$1; shift
  local before; before=$(cpu_ticks)
  echo "$name: load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$B" bench --base-url "http://127.0.0.1:$PORT" --endpoint chat --num-prompts "$N" --max-concurrency 16 \
    --random-input-len 64 --random-output-len 128 --seed 1 --warmup 1 --progress=false \
    --output "$OUT/$name.json" "$@" > "$OUT/$name.txt"
  echo "$(( $(cpu_ticks) - before )) $TICK" > "$OUT/$name.cpu"
}
{
  echo "start: $(date -u +%FT%TZ) $(uptime)"
  for r in $(seq "$ROUNDS"); do
    bench "A$r"
    bench "B$r" --response-format tools/perf/structured/contact.json
    bench "C$r" --response-format tools/perf/structured/contact-bounded.json
    bench "D$r" --random-output-len 56
    echo "round $r done: $(date -u +%FT%TZ) $(uptime)"
  done
  python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for k in "ABCD":
    tps, tpot, toks, cpu = [], [], [], []
    for r in range(1, rounds + 1):
        s = json.load(open(f"{out}/{k}{r}.json"))["runs"][0]["summary"]
        tps.append(s["output_token_throughput"]); tpot.append(s["tpot"]["median_ms"])
        toks.append(s["output_tokens"] / s["succeeded"])
        ticks, hz = map(int, open(f"{out}/{k}{r}.cpu").read().split())
        cpu.append(1000 * ticks / hz / s["output_tokens"])
    med[k] = (statistics.median(tps), statistics.median(cpu))
    print(f"{k}: output tok/s {' '.join(f'{x:.1f}' for x in tps)} (median {med[k][0]:.1f}); "
          f"server CPU ms per output token {' '.join(f'{x:.1f}' for x in cpu)} (median {med[k][1]:.1f}); "
          f"median TPOT ms {' '.join(f'{x:.0f}' for x in tpot)}; output tokens per request {' '.join(f'{x:.1f}' for x in toks)}")
for k, base in (("B", "A"), ("C", "D")):
    print(f"{k} against {base}: output tok/s {100 * (1 - med[k][0] / med[base][0]):+.1f}% below; "
          f"CPU per output token {100 * (med[k][1] / med[base][1] - 1):+.1f}% above")
PY
  echo "end: $(date -u +%FT%TZ) $(uptime)"
} | tee "$OUT/result.txt"
