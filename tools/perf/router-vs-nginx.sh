#!/usr/bin/env bash
# Router overhead against nginx in one run: the shared script
# (/work/shared/tools/perf-router-vs-nginx.sh: direct, nginx proxy_pass,
# router --colocated, up; concurrency 1 and 64) on a pdserve whose simulated
# model takes no step time (--sim-profile none on serve, router and up: the
# default H100 step times would measure the model, not the proxy).
# Usage: tools/perf/router-vs-nginx.sh [ROUNDS] [BINARY]
#   BINARY: a built pdserve (default: build this tree). Needs nginx and jq.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
SHARED=${SHARED_SCRIPT:-/work/shared/tools/perf-router-vs-nginx.sh}
T=$(mktemp -d)
B=${2:-$T/pdserve.bin}
[ -n "${2:-}" ] || go build -o "$B" ./cmd/pdserve
cat >"$T/pdserve" <<W
#!/usr/bin/env bash
case "\$1" in serve|router|up) c=\$1; shift; exec "$B" "\$c" --sim-profile none "\$@";; esac
exec "$B" "\$@"
W
chmod +x "$T/pdserve"
lscpu | grep -E '^Model name' || true
bash "$SHARED" "$T/pdserve" "$ROUNDS" | tee "$T/rounds.txt"
# Medians over the rounds; added p50 = E2E p50 at concurrency 1 less direct's;
# throughput at concurrency 64 as a ratio to nginx's.
awk '{ split($3, a, "="); split($5, e, "="); split($7, q, "=");
       k = $1 " " $2; n[k]++; E[k, n[k]] = e[2]; Q[k, n[k]] = q[2] }
  function med(A, k, m,   i, j, t, v) { for (i = 1; i <= m; i++) v[i] = A[k, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
  END { d1 = med(E, "direct c=1", n["direct c=1"])
    for (x = 1; x <= 4; x++) { name = x == 1 ? "direct" : x == 2 ? "nginx" : x == 3 ? "router" : "pd_up"
      e1[name] = med(E, name " c=1", n[name " c=1"]); q64[name] = med(Q, name " c=64", n[name " c=64"]) }
    printf "medians of %d rounds\n", n["direct c=1"]
    for (x = 1; x <= 4; x++) { name = x == 1 ? "direct" : x == 2 ? "nginx" : x == 3 ? "router" : "pd_up"
      printf "%-7s c=1 e2e_p50_ms=%.3f added_ms=%.3f | c=64 req_s=%.0f (%.2fx direct, %.2fx nginx)\n", name, e1[name],
        e1[name] - d1, q64[name], q64[name] / q64["direct"], q64[name] / q64["nginx"] }
    printf "router added p50 / nginx added p50 = %.2f\n", (e1["router"] - d1) / (e1["nginx"] - d1) }' "$T/rounds.txt"
