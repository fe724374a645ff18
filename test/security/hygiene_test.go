package security

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// exchange writes raw to a new connection to addr (from another goroutine,
// so a server that answers before it has read everything is heard) and
// reads every answer on the connection until it closes: their statuses and
// bodies. The connection must close within 10 s after its last answer.
func exchange(t *testing.T, addr, raw string, answers int) (statuses []int, bodies []string, closed bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_, _ = io.WriteString(c, raw) // a server that refuses the head may reset the rest
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for range answers {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				closed = true
				break
			}
			t.Fatalf("answer %d: %v", len(statuses)+1, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("answer %d body: %v", len(statuses)+1, err)
		}
		statuses, bodies = append(statuses, resp.StatusCode), append(bodies, string(b))
	}
	if !closed {
		_, err := br.ReadByte()
		closed = err != nil && !errors.Is(err, net.ErrClosed) && !isTimeout(err)
	}
	c.Close()
	<-wrote
	return statuses, bodies, closed
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestFrontDoorFraming: a request with both Content-Length and
// Transfer-Encoding is answered (by its chunked body) and its connection
// closed, so a request pipelined behind it is never served (RFC 9112,
// section 6.1); a request with a Content-Length keeps its connection for
// the next.
func TestFrontDoorFraming(t *testing.T) {
	t.Parallel()
	up := start(t, "up", "up", "--port", "0")
	base := waitLine(t, up, readyRE)
	defer stop(t, up)
	u, _ := url.Parse(base)
	models := "GET /v1/models HTTP/1.1\r\nHost: pdserve\r\n\r\n"

	plain := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: pdserve\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(completion), completion)
	last := "GET /v1/models HTTP/1.1\r\nHost: pdserve\r\nConnection: close\r\n\r\n"
	if st, bodies, _ := exchange(t, u.Host, plain+last, 2); len(st) != 2 || st[0] != 200 || st[1] != 200 {
		t.Fatalf("a request with a Content-Length and one pipelined behind it: %v %q, want both answered", st, bodies)
	}

	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(completion), completion)
	smuggle := "POST /v1/completions HTTP/1.1\r\nHost: pdserve\r\nContent-Type: application/json\r\n" +
		"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
	st, bodies, closed := exchange(t, u.Host, smuggle+models, 2)
	if len(st) != 1 || !closed {
		t.Fatalf("Content-Length and Transfer-Encoding, a request pipelined behind: answers %v %q (closed %v), want one answer and the connection closed",
			st, bodies, closed)
	}
	var comp struct{ Choices []struct{ Text string } }
	if st[0] != 200 || json.Unmarshal([]byte(bodies[0]), &comp) != nil || len(comp.Choices) != 1 {
		t.Fatalf("the request read by its chunked body: %d %s", st[0], bodies[0])
	}
}

// TestFrontDoorHeaderBounds: the request's head is bounded as nginx's
// defaults bound it (8 KiB a line, 32 KiB in all) and to 100 header
// lines: beyond, 431 (414 for the request line) and nothing served.
func TestFrontDoorHeaderBounds(t *testing.T) {
	t.Parallel()
	up := start(t, "up", "up", "--port", "0")
	base := waitLine(t, up, readyRE)
	defer stop(t, up)
	u, _ := url.Parse(base)
	head := func(path string, lines []string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: pdserve\r\n" + strings.Join(lines, "") + "Connection: close\r\n\r\n"
	}
	many := func(n, size int) []string {
		var ls []string
		for i := range n {
			name := fmt.Sprintf("X-H%d: ", i)
			ls = append(ls, name+strings.Repeat("v", size-len(name))+"\r\n")
		}
		return ls
	}
	for _, tc := range []struct {
		name  string
		raw   string
		want  int
		jsonE bool // the refusal is an OpenAI error body
	}{
		{"90 header lines, one of 8000 bytes, 31 KiB in all", head("/v1/models", append(many(89, 260), many(1, 8000)...)), 200, false},
		{"a header line over 8 KiB", head("/v1/models", many(1, 8<<10+10)), 431, true},
		{"101 header lines", head("/v1/models", many(101, 10)), 431, true},
		{"33 KiB of headers in lines of 6.6 KiB", head("/v1/models", many(5, 6758)), 431, true},
		{"10,000 header lines", head("/v1/models", many(10000, 12)), 431, false},
		{"1 MiB of headers", head("/v1/models", many(128, 8<<10)), 431, false},
		{"a request line over 8 KiB", head("/v1/models?q="+strings.Repeat("a", 8<<10), nil), 414, true},
	} {
		st, bodies, _ := exchange(t, u.Host, tc.raw, 1)
		if len(st) != 1 || st[0] != tc.want {
			t.Errorf("%s: answers %v, want %d", tc.name, st, tc.want)
			continue
		}
		if tc.jsonE {
			var e struct {
				Error struct{ Type, Message, Code string }
			}
			if err := json.Unmarshal([]byte(bodies[0]), &e); err != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" || e.Error.Code == "" {
				t.Errorf("%s: body %s, want an OpenAI error", tc.name, bodies[0])
			}
		}
	}
}
