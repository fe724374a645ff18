#!/usr/bin/env bash
# The KV cache's dtype on the CPU model: for each of f32, bf16 and f16,
# (1) the pages a 2 GiB pool holds for the SmolLM2-135M-shaped GGUF file
# (pdserve serve --kv-cache-dtype X, pdserve_kv_pages), and (2) decode
# tokens/s of BenchmarkSmolLM2 at batch 16 with 128 and with 1024 tokens of
# context (decode-batch16, decode-batch16-ctx1024), 2 threads, the dtypes
# and kernel sets interleaved and their order rotated every round, so drift
# on a shared machine hits all alike. The checkpoint and the GGUF file are
# tools/llamacpp-bench's (written once into WORK).
# Usage: tools/perf/kv-dtype.sh [ROUNDS]   (WORK=/tmp/llb-kv by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-${1:-4}}
WORK=${WORK:-/tmp/llb-kv}
CONFIGS=${CONFIGS:-"avx512:f32 avx512:bf16 avx512:f16 avx2:f32 avx2:f16"}
mkdir -p "$WORK"
go run ./tools/llamacpp-bench -rounds 0 -skip-verify -types bf16 -work "$WORK" >/dev/null
MODEL=$WORK/smollm2-135m-synthetic-bf16.gguf
go build -o "$WORK/pdserve" ./cmd/pdserve
go test -c -o "$WORK/llama.test" ./internal/model/llama

echo "pages of a 2 GiB pool (16 tokens each):"
for dt in f32 bf16 f16; do
  "$WORK/pdserve" serve --model "$MODEL" --port 18431 --kv-cache-memory 2GiB --kv-cache-dtype "$dt" --log-level warn >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:18431/health >/dev/null && break; sleep 0.2; done
  echo "$dt $(curl -s http://127.0.0.1:18431/metrics | grep '^pdserve_kv_pages{.*free' | awk '{print $2}')"
  kill "$pid"
  wait "$pid" || true
done

read -ra cfgs <<< "$CONFIGS"
n=${#cfgs[@]}
for r in $(seq "$ROUNDS"); do
  echo "round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for ((j = 0; j < n; j++)); do
    c=${cfgs[$(((j + r) % n))]}
    k=${c%%:*} dt=${c##*:}
    (cd "$WORK" && GOMAXPROCS=2 ./llama.test -test.run '^$' -test.bench 'SmolLM2/^decode-batch16(-ctx1024)?$' \
      -test.benchtime 64x -model "$MODEL" -kernels "$k" -kv-dtype "$dt" 2>&1) |
      awk -v r="$r" -v c="$k $dt" '/tok\/s/ { s = ""; for (i = 1; i <= NF; i++) if ($i == "tok/s" || $i == "cpu-ms/tok") s = s " " $(i-1) " " $i; print "r" r, c, $1, s }'
  done
done
