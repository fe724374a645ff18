package openai

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// checkParsed checks the invariants of a parse: an *Error with a 4xx status,
// or a request the engine can run.
func checkParsed(t *testing.T, req *request, err error) {
	t.Helper()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v is not an *Error", err)
		}
		if e.Status != 400 && e.Status != 404 && e.Status != 413 {
			t.Fatalf("status %d for %v", e.Status, e)
		}
		if e.Message == "" || e.Type != TypeInvalidRequest {
			t.Fatalf("error %+v", e)
		}
		return
	}
	switch {
	case len(req.promptIDs) == 0:
		t.Fatal("empty prompt accepted")
	case req.maxTokens < 1:
		t.Fatalf("max_tokens %d accepted", req.maxTokens)
	case len(req.promptIDs)+req.maxTokens > testContextLen:
		t.Fatalf("prompt %d + max_tokens %d > context", len(req.promptIDs), req.maxTokens)
	case len(req.stop) > MaxStopStrings:
		t.Fatalf("%d stop strings", len(req.stop))
	case len(req.stopTokenIDs) > MaxStopTokenIDs:
		t.Fatalf("%d stop token ids", len(req.stopTokenIDs))
	}
	for _, id := range req.promptIDs {
		if id < 0 {
			t.Fatalf("negative token id %d", id)
		}
	}
	for _, s := range req.stop {
		if s == "" || len(s) > MaxStopStringBytes {
			t.Fatalf("stop string %q", s)
		}
	}
	if err := req.sampling.Validate(); err != nil {
		t.Fatal(err)
	}
	if req.sampling.TopK < 0 {
		t.Fatalf("top_k %d", req.sampling.TopK)
	}
}

func FuzzParseCompletionRequest(f *testing.F) {
	f.Add([]byte(`{"prompt":"hi","max_tokens":3,"stop":["a"],"stream":true}`))
	f.Add([]byte(`{"prompt":[104.0,1e2],"max_tokens":3.0,"seed":-1e3,"top_k":4.5,"temperature":1e39,"stream_options":{}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		// Bodies go through the limit reader as in the handler.
		req, err := testParser().parseCompletion(limitedReader(body, 4096))
		checkParsed(t, req, err)
	})
}

func FuzzParseChatRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3.0,"min_tokens":1e0,"stream_options":{"include_usage":true}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := testParser().parseChat(limitedReader(body, 4096))
		checkParsed(t, req, err)
		if err == nil && !req.chat {
			t.Fatal("chat request not marked chat")
		}
	})
}

// FuzzOutput feeds arbitrary output text, cut into arbitrary tokens, against
// arbitrary stop strings: the text streamed must equal the final text (no
// stop-string prefix is ever sent and taken back), and the final text must
// contain no stop string unless include_stop_str_in_output is set.
func FuzzOutput(f *testing.F) {
	f.Add([]byte("Hello END world"), "END", []byte{1, 2, 3}, false)
	f.Add([]byte("aaab\xc3\xa9!"), "aab\x00é!", []byte{2}, true)
	f.Fuzz(func(t *testing.T, text []byte, stopList string, cuts []byte, includeStop bool) {
		if len(text) > 2048 || len(stopList) > 256 {
			return
		}
		var stops []string
		for _, s := range strings.Split(stopList, "\x00") {
			if s != "" && len(stops) < MaxStopStrings {
				stops = append(stops, s)
			}
		}
		var chunks []Chunk
		for i := 0; len(text) > 0; i++ {
			n := 1
			if len(cuts) > 0 {
				n = 1 + int(cuts[i%len(cuts)])%5
			}
			n = min(n, len(text))
			chunks = append(chunks, Chunk{Tokens: toks(string(text[:n]))})
			text = text[n:]
		}
		total := 0
		for _, c := range chunks {
			total += len(c.Tokens)
		}
		chunks = append(chunks, Chunk{FinishReason: "length"})
		o := newOutput(byteTokenizer{}, &request{stop: stops, includeStopStr: includeStop}, nil)
		var sent strings.Builder
		for _, c := range chunks {
			o.add(c)
			s, _, _ := o.take()
			sent.WriteString(s)
			if o.finished {
				break
			}
		}
		got, ids := o.all()
		if !o.finished {
			t.Fatal("not finished")
		}
		if sent.String() != got {
			t.Fatalf("streamed %q, final %q", sent.String(), got)
		}
		for _, s := range stops {
			if !includeStop && strings.Contains(got, s) {
				t.Fatalf("final text %q contains stop %q", got, s)
			}
		}
		if o.finish == "stop" && includeStop && !hasAnySuffix(got, stops) {
			t.Fatalf("final text %q does not end with a stop string", got)
		}
		if o.finish == "length" && len(ids) != total {
			t.Fatalf("%d tokens counted, %d sent", len(ids), total)
		}
	})
}

func hasAnySuffix(s string, suffixes []string) bool {
	for _, x := range suffixes {
		if strings.HasSuffix(s, x) {
			return true
		}
	}
	return false
}

// limitedReader limits a fuzz body as the handler does.
func limitedReader(b []byte, limit int64) io.Reader {
	return http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(b)), limit)
}
