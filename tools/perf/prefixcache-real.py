#!/usr/bin/env python3
"""TTFT of a shared prefix on a real checkpoint, with and without the prefix cache.

Sends to two servers of the same model (A: the cache on, B: --disable-prefix-cache),
alternating A, B, A, B..., N prompts each: a fixed PREFIX-token prefix of random token
ids and SUFFIX unique random ids, as /v1/completions with a token-id prompt, stream,
max_tokens 8, ignore_eos. TTFT is the time from sending the request to the first SSE
chunk carrying text or a token. The first request to A computes the prefix (its miss);
the table gives it apart and the median of the rest.
Usage: prefixcache-real.py URL_CACHE URL_NOCACHE [N PREFIX SUFFIX VOCAB]
"""
import json, random, statistics, sys, time, urllib.request

def model_of(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=60) as r:
        return json.load(r)["data"][0]["id"]

def ttft(url, prompt):
    body = json.dumps({"model": model_of(url), "prompt": prompt, "max_tokens": 8, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.monotonic()
    first, cached = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            d = json.loads(line[5:])
            if first is None and d.get("choices"):
                first = time.monotonic() - t0
            u = d.get("usage")
            if u:
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return first, cached

def main():
    a, b = sys.argv[1], sys.argv[2]
    n, plen, slen, vocab = (int(x) for x in (sys.argv[3:] + ["6", "1024", "64", "49152"][len(sys.argv) - 3:]))
    rng = random.Random(1)
    prefix = [rng.randrange(1, vocab) for _ in range(plen)]
    res = {a: [], b: []}
    for i in range(n):
        for url in (a, b):
            p = prefix + [rng.randrange(1, vocab) for _ in range(slen)]
            t, c = ttft(url, p)
            res[url].append((t, c))
            print(f"{'cache' if url == a else 'nocache'} #{i + 1}: TTFT {t * 1000:.0f} ms, cached_tokens {c}", flush=True)
    ca = [t for t, _ in res[a][1:]]
    nc = [t for t, _ in res[b]]
    print(f"cache: first (miss) {res[a][0][0] * 1000:.0f} ms, median of the other {len(ca)} {statistics.median(ca) * 1000:.0f} ms")
    print(f"nocache: median of {len(nc)} {statistics.median(nc) * 1000:.0f} ms")
    print(f"ratio (nocache median / cache median of hits): {statistics.median(nc) / statistics.median(ca):.1f}x")

main()
