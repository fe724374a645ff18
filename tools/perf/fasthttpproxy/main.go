// Command fasthttpproxy is the floor of a Go proxy that does not use
// net/http, for tools/perf/router-cpu.sh (FLOOR=1): valyala/fasthttp's
// server and HostClient in front of one upstream, the answer streamed
// through and flushed at every read, nothing else. Set beside goproxy (the
// net/http floor) it shows what the choice of HTTP server costs per
// request. It is its own module so that pdserve does not depend on
// fasthttp.
//
// fasthttp, unlike net/http, does not watch a connection for the client's
// leaving while a handler runs, so a server on it learns that a client left
// only when it next writes to it: for pdserve that would be a request
// queued or in prefill that goes on after its client has gone.
//
// Usage: go run . -listen 127.0.0.1:PORT -upstream 127.0.0.1:WORKER
package main

import (
	"bufio"
	"flag"
	"log"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "the upstream's host:port")
	flag.Parse()
	if *upstream == "" {
		log.Fatal("-upstream: want host:port")
	}
	c := &fasthttp.HostClient{Addr: *upstream, MaxConns: 1024, StreamResponseBody: true}
	h := func(ctx *fasthttp.RequestCtx) {
		req := fasthttp.AcquireRequest()
		ctx.Request.CopyTo(req)
		resp := fasthttp.AcquireResponse()
		err := c.Do(req, resp)
		fasthttp.ReleaseRequest(req)
		if err != nil {
			fasthttp.ReleaseResponse(resp)
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			return
		}
		ctx.SetStatusCode(resp.StatusCode())
		resp.Header.CopyTo(&ctx.Response.Header)
		ctx.Response.Header.Del("Content-Length")
		body := resp.BodyStream()
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer fasthttp.ReleaseResponse(resp)
			defer resp.CloseBodyStream()
			buf := make([]byte, 4096)
			for {
				n, err := body.Read(buf)
				if n > 0 {
					_, _ = w.Write(buf[:n])
					if w.Flush() != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
	log.Fatal(fasthttp.ListenAndServe(*listen, h))
}
