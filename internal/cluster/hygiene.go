package cluster

import (
	"fmt"
	"net/http"

	"github.com/pdserve/pdserve/internal/openai"
)

// Bounds of a request's head on every server (the front door and the
// worker API), nginx's defaults (large_client_header_buffers 4 8k): a
// longer request line is refused with 414, a longer header line, more
// header lines or a longer head with 431.
const (
	// MaxHeaderLineBytes bounds the request line and each header line.
	MaxHeaderLineBytes = 8 << 10
	// MaxHeaderBytes bounds the request line and all header lines.
	MaxHeaderBytes = 32 << 10
	// MaxHeaderCount bounds the number of header lines.
	MaxHeaderCount = 100
)

// Error codes of the head's refusals.
const (
	// CodeHeaderTooLarge: 431, a header line too long, too many header
	// lines or a head too long.
	CodeHeaderTooLarge = "request_header_fields_too_large"
	// CodeURITooLong: 414, a request line too long.
	CodeURITooLong = "uri_too_long"
)

// hygiene puts RFC 9112's framing rules and the head's bounds before h.
//
// A request with a chunked body is answered and its connection closed
// (Connection: close): a request carrying both Content-Length and
// Transfer-Encoding must be (RFC 9112, section 6.1, a request smuggling
// defence), and net/http drops the Content-Length of a chunked request
// before any handler sees it, so every chunked request is treated alike.
// So is every HTTP/1.0 request (a Transfer-Encoding in one makes its
// framing faulty, and net/http drops that header too). HTTP/1.1 requests
// with a Content-Length, the only kind pdserve's own clients and the
// OpenAI SDKs send, keep their connection.
//
// net/http reads at most MaxHeaderBytes (and a 4 KiB margin) of a head
// and answers a longer one with 431 itself; h checks the lines and the
// total of the head it parsed.
//
// A path that is not canonical ("//", ".", "..") is refused with a 400
// naming the canonical one on every server (openai.CanonicalPaths), before
// any key is checked: a worker's mux would redirect it or answer 404.
func hygiene(h http.Handler) http.Handler {
	h = openai.CanonicalPaths(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 && (len(r.TransferEncoding) > 0 || r.ProtoMinor == 0) {
			w.Header().Set("Connection", "close")
		}
		if e := checkHead(r); e != nil {
			openai.WriteError(w, e)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// checkHead returns why r's head is refused, or nil. Lines are counted as
// they came (name, ": ", value), each with its CRLF.
func checkHead(r *http.Request) *openai.Error {
	line := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto)
	if line > MaxHeaderLineBytes {
		return &openai.Error{Status: http.StatusRequestURITooLong, Type: openai.TypeInvalidRequest, Code: CodeURITooLong,
			Message: fmt.Sprintf("the request line is longer than %d bytes", MaxHeaderLineBytes)}
	}
	tooLarge := func(format string, args ...any) *openai.Error {
		return &openai.Error{Status: http.StatusRequestHeaderFieldsTooLarge, Type: openai.TypeInvalidRequest,
			Code: CodeHeaderTooLarge, Message: fmt.Sprintf(format, args...)}
	}
	total, count := line+2, 0
	field := func(name string, n int) *openai.Error {
		l := len(name) + 2 + n
		if l > MaxHeaderLineBytes {
			if len(name) > 64 {
				name = name[:64] + "…"
			}
			return tooLarge("the header line %s is longer than %d bytes", name, MaxHeaderLineBytes)
		}
		total += l + 2
		count++
		return nil
	}
	if r.Host != "" {
		if e := field("Host", len(r.Host)); e != nil {
			return e
		}
	}
	for name, vs := range r.Header {
		for _, v := range vs {
			if e := field(name, len(v)); e != nil {
				return e
			}
		}
	}
	switch {
	case count > MaxHeaderCount:
		return tooLarge("%d header lines, more than %d", count, MaxHeaderCount)
	case total+2 > MaxHeaderBytes:
		return tooLarge("the request line and headers are longer than %d bytes", MaxHeaderBytes)
	}
	return nil
}
