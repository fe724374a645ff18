// Command goproxy is the floor of a Go HTTP proxy for tools/perf/router-cpu.sh:
// net/http's server and httputil.ReverseProxy (net/http's client, flushing
// every write: FlushInterval -1) in front of one upstream, with nothing
// else — no parsing, no tokenizer, no metrics. What it spends per request
// is what any proxy on net/http spends, and so the part of the router's
// overhead over nginx that a net/http server cannot shed.
//
// Usage: go run ./tools/perf/goproxy -listen 127.0.0.1:PORT -upstream http://127.0.0.1:WORKER
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "the upstream's base URL")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || u.Host == "" {
		log.Fatalf("-upstream: want a URL such as http://127.0.0.1:8000, got %q", *upstream)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.FlushInterval = -1
	p.Transport = &http.Transport{MaxIdleConnsPerHost: 1024}
	log.Fatal(http.ListenAndServe(*listen, p))
}
