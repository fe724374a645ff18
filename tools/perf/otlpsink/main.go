// Command otlpsink is an OTLP/HTTP trace receiver that counts and discards
// what it gets: the cheapest collector there is, for measuring what tracing
// costs pdserve itself (tools/perf, docs/performance.md "Tracing
// overhead") without a real backend's CPU on the same machine.
//
//	go run ./tools/perf/otlpsink -addr 127.0.0.1:4318
//
// It answers POST /v1/traces with 200 and an empty ExportTraceServiceResponse
// (an empty protobuf message), and GET /stats with the requests and bytes
// received.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync/atomic"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:4318", "listen address")
	flag.Parse()
	var reqs, bytes atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, 64<<20))
		reqs.Add(1)
		bytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "requests %d bytes %d\n", reqs.Load(), bytes.Load())
	})
	log.Fatal(http.ListenAndServe(*addr, mux))
}
