#!/usr/bin/env bash
# CPU time the proxy itself spends per request, which drifts less than
# throughput on a shared machine: nginx proxy_pass and `pdserve router
# --colocated` in front of one colocated worker (no step time, tiny KV), the
# same traffic as /work/shared/tools/perf-router-vs-nginx.sh at concurrency
# 64, alternated ROUNDS times. Prints the proxy's user+system CPU per request
# (from /proc/PID/stat) and the TCP connections opened per request during the
# run (nstat TcpActiveOpens, all processes; the bench's own are opened before).
# FLOOR=1 adds, after nginx, the floor of any proxy on Go's net/http
# (tools/perf/goproxy: httputil.ReverseProxy and nothing else) and of one on
# valyala/fasthttp (tools/perf/fasthttpproxy, its own module).
# Usage: [FLOOR=1] tools/perf/router-cpu.sh [ROUNDS] [BINARY...]  (default: build this tree)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}; shift || true
T=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then go build -o "$T/pdserve" ./cmd/pdserve; BINS=("$T/pdserve"); fi
N=${N:-3000}
SIM=(--sim-profile none --sim-layers 2 --sim-kv-heads 1 --sim-head-dim 16)
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
up() { for _ in $(seq 100); do curl -fs -o /dev/null "http://127.0.0.1:$1/${2:-health}" && return; sleep 0.1; done; }
B0=${BINS[0]}
S=$(fp); "$B0" serve --port "$S" "${SIM[@]}" >"$T/serve.log" 2>&1 & PIDS+=($!); up "$S"
NG=$(fp)
cat >"$T/nginx.conf" <<NGC
worker_processes 1; daemon off; pid $T/nginx.pid; error_log $T/nginx.err;
events { worker_connections 4096; }
http { access_log off; upstream w { server 127.0.0.1:$S; keepalive 128; }
  server { listen 127.0.0.1:$NG; location / { proxy_pass http://w; proxy_http_version 1.1;
    proxy_set_header Connection ""; proxy_buffering off; } } }
NGC
nginx -c "$T/nginx.conf" -p "$T" >"$T/nginx.out" 2>&1 & PIDS+=($!); up "$NG" v1/models
sleep 0.5
NGW=$(pgrep -P "$(cat "$T/nginx.pid")" | head -1) # the worker process
lscpu | grep -E '^Model name' || true
measure() { # name port pid
  "$B0" bench --base-url "http://127.0.0.1:$2" --num-prompts 200 --max-concurrency 64 --random-input-len 32 \
    --random-output-len 16 --seed 2 --progress=false >/dev/null 2>&1 # warm connections
  local t0 o0; t0=$(ticks "$3"); o0=$(nstat -az TcpActiveOpens | awk '/TcpActiveOpens/ {print $2}')
  "$B0" bench --base-url "http://127.0.0.1:$2" --num-prompts "$N" --max-concurrency 64 --random-input-len 32 \
    --random-output-len 16 --seed 1 --progress=false --output "$T/$1.json" >/dev/null 2>&1
  local t1 o1; t1=$(ticks "$3"); o1=$(nstat -az TcpActiveOpens | awk '/TcpActiveOpens/ {print $2}')
  awk -v n="$1" -v t="$((t1 - t0))" -v o="$((o1 - o0))" -v N="$N" -v hz="$(getconf CLK_TCK)" -v r="$(jq .runs[0].summary.request_throughput "$T/$1.json")" \
    'BEGIN { printf "%-10s cpu_us_per_req=%.0f conns_per_req=%.3f req_s=%.0f\n", n, t / hz / N * 1e6, (o - 64) / N, r }'
}
if [ "${FLOOR:-0}" = 1 ]; then
  go build -o "$T/goproxy" ./tools/perf/goproxy
  (cd tools/perf/fasthttpproxy && go build -o "$T/fasthttpproxy" .)
fi
for r in $(seq "$ROUNDS"); do
  measure nginx "$NG" "$NGW"
  if [ "${FLOOR:-0}" = 1 ]; then
    GP=$(fp); "$T/goproxy" -listen "127.0.0.1:$GP" -upstream "http://127.0.0.1:$S" 2>"$T/goproxy.log" & gpid=$!
    up "$GP" v1/models; measure goproxy "$GP" "$gpid"; kill "$gpid"; wait "$gpid" 2>/dev/null || true
    FP=$(fp); "$T/fasthttpproxy" -listen "127.0.0.1:$FP" -upstream "127.0.0.1:$S" 2>"$T/fasthttpproxy.log" & fpid=$!
    up "$FP" v1/models; measure fasthttp "$FP" "$fpid"; kill "$fpid"; wait "$fpid" 2>/dev/null || true
  fi
  for b in "${BINS[@]}"; do
    RP=$(fp); "$b" router --port "$RP" --colocated "http://127.0.0.1:$S" "${SIM[@]}" >"$T/router.log" 2>&1 & rpid=$!
    up "$RP"; measure "router:$(basename "$b")" "$RP" "$rpid"; kill "$rpid"; wait "$rpid" 2>/dev/null || true
  done
done
