package openai

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// feed runs chunks through an output as a streaming response would and
// returns every piece of text take handed out, in order.
func feed(o *output, chunks []Chunk) []string {
	var sent []string
	for _, c := range chunks {
		o.add(c)
		if text, _, _ := o.take(); text != "" {
			sent = append(sent, text)
		}
		if o.finished {
			break
		}
	}
	return sent
}

func TestOutputStop(t *testing.T) {
	tests := []struct {
		name        string
		stop        []string
		includeStop bool
		stopIDs     []int32
		ignoreEOS   bool
		minTokens   int
		chunks      []Chunk
		wantSent    []string // text pieces handed out while streaming
		wantText    string
		wantIDs     int // tokens counted
		wantFinish  string
		wantStopped bool
	}{
		{name: "no stop", chunks: chunksOf("Hello", 2, "length"),
			wantSent: []string{"He", "ll", "o"}, wantText: "Hello", wantIDs: 5, wantFinish: "length"},
		{name: "stop split across tokens", stop: []string{"END"}, chunks: chunksOf("Hi END more", 1, "length"),
			wantSent: []string{"H", "i", " "}, wantText: "Hi ", wantIDs: 6, wantFinish: "stop", wantStopped: true},
		{name: "stop in one token", stop: []string{"END"}, chunks: []Chunk{{Tokens: toks("abEND")}, {Tokens: toks("x"), FinishReason: "length"}},
			wantSent: []string{"ab"}, wantText: "ab", wantIDs: 5, wantFinish: "stop", wantStopped: true},
		{name: "false start released", stop: []string{"END"}, chunks: chunksOf("a ENd b", 1, "length"),
			wantSent: []string{"a", " ", "ENd", " ", "b"}, wantText: "a ENd b", wantIDs: 7, wantFinish: "length"},
		{name: "held prefix flushed at the end", stop: []string{"END"}, chunks: chunksOf("aEN", 1, "length"),
			wantSent: []string{"a", "EN"}, wantText: "aEN", wantIDs: 3, wantFinish: "length"},
		{name: "include stop string", stop: []string{"END"}, includeStop: true, chunks: []Chunk{{Tokens: toks("aENDb")}, {Tokens: toks("c"), FinishReason: "length"}},
			wantSent: []string{"aEND"}, wantText: "aEND", wantIDs: 4, wantFinish: "stop", wantStopped: true},
		{name: "earliest of two stops", stop: []string{"cd", "bcde"}, chunks: chunksOf("abcdef", 6, ""),
			wantSent: []string{"ab"}, wantText: "ab", wantIDs: 4, wantFinish: "stop", wantStopped: true},
		{name: "overlapping prefixes held", stop: []string{"aab"}, chunks: chunksOf("aaab", 1, ""),
			wantSent: []string{"a"}, wantText: "a", wantIDs: 4, wantFinish: "stop", wantStopped: true},
		{name: "multi-byte stop split inside a character", stop: []string{"é!"}, chunks: chunksOf("caé!", 1, ""),
			wantSent: []string{"c", "a"}, wantText: "ca", wantIDs: 5, wantFinish: "stop", wantStopped: true},
		{name: "tokens after the match are not counted", stop: []string{"x"}, chunks: []Chunk{{Tokens: toks("axbcd"), FinishReason: "length"}},
			wantSent: []string{"a"}, wantText: "a", wantIDs: 2, wantFinish: "stop"},
		{name: "stop matched in the engine's last chunk: no Stop", stop: []string{"b"}, chunks: []Chunk{{Tokens: toks("ab"), FinishReason: "stop"}},
			wantSent: []string{"a"}, wantText: "a", wantIDs: 2, wantFinish: "stop"},
		{name: "EOS counted, not rendered", chunks: []Chunk{{Tokens: toks("ok")}, {Tokens: []Token{{ID: eosID}}, FinishReason: "stop"}},
			wantSent: []string{"ok"}, wantText: "ok", wantIDs: 3, wantFinish: "stop"},
		{name: "EOS rendered with ignore_eos", ignoreEOS: true, chunks: []Chunk{{Tokens: append(toks("ok"), Token{ID: eosID}), FinishReason: "length"}},
			wantSent: []string{"ok</s>"}, wantText: "ok</s>", wantIDs: 3, wantFinish: "length"},
		{name: "stop token id not rendered", stopIDs: []int32{'!'}, chunks: []Chunk{{Tokens: toks("hey!"), FinishReason: "stop"}},
			wantSent: []string{"hey"}, wantText: "hey", wantIDs: 4, wantFinish: "stop"},
		{name: "stop string completed by the flush", stop: []string{"\uFFFD"}, chunks: []Chunk{{Tokens: toks("a\xc3")}, {FinishReason: "length"}},
			wantSent: []string{"a"}, wantText: "a", wantIDs: 2, wantFinish: "stop"},
		{name: "stop string not matched within min_tokens", stop: []string{"a"}, minTokens: 3, chunks: chunksOf("abcab", 1, "length"),
			wantSent: []string{"a", "b", "c"}, wantText: "abc", wantIDs: 4, wantFinish: "stop", wantStopped: true},
		{name: "stop string ending after min_tokens matched", stop: []string{"bc"}, minTokens: 2, chunks: chunksOf("abcd", 1, "length"),
			wantSent: []string{"a"}, wantText: "a", wantIDs: 3, wantFinish: "stop", wantStopped: true},
		{name: "incomplete UTF-8 held by the decoder", chunks: chunksOf("é", 1, "length"),
			wantSent: []string{"é"}, wantText: "é", wantIDs: 2, wantFinish: "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &request{stop: tt.stop, includeStopStr: tt.includeStop, stopTokenIDs: tt.stopIDs, ignoreEOS: tt.ignoreEOS, minTokens: tt.minTokens}
			o := newOutput(byteTokenizer{}, req, []int32{eosID})
			sent := feed(o, tt.chunks)
			if !o.finished {
				t.Fatal("not finished")
			}
			if diff := cmp.Diff(tt.wantSent, sent); diff != "" {
				t.Errorf("sent (-want +got):\n%s", diff)
			}
			text, ids := o.all()
			if text != tt.wantText || len(ids) != tt.wantIDs || o.finish != tt.wantFinish || o.stopped != tt.wantStopped {
				t.Errorf("text %q ids %d finish %q stopped %v; want %q %d %q %v",
					text, len(ids), o.finish, o.stopped, tt.wantText, tt.wantIDs, tt.wantFinish, tt.wantStopped)
			}
			if strings.Join(sent, "") != text {
				t.Errorf("streamed %q != text %q", strings.Join(sent, ""), text)
			}
		})
	}
}

// TestOutputNeverLeaksStopPrefix checks, for every way of cutting a text into
// tokens of up to 3 bytes, that the streamed text equals the final text: no
// byte of a stop string is ever sent and then taken back.
func TestOutputNeverLeaksStopPrefix(t *testing.T) {
	const text, want = "xaabab aab!aabb", "xaabab aa"
	stops := []string{"aabb", "b!a", "ab,"}
	var cuts func(s string, acc []string)
	n := 0
	cuts = func(s string, acc []string) {
		if s == "" {
			var chunks []Chunk
			for _, p := range acc {
				chunks = append(chunks, Chunk{Tokens: toks(p)})
			}
			chunks = append(chunks, Chunk{FinishReason: "length"})
			o := newOutput(byteTokenizer{}, &request{stop: stops}, nil)
			sent := strings.Join(feed(o, chunks), "")
			got, _ := o.all()
			if sent != got || got != want {
				t.Fatalf("cut %q: streamed %q, final %q, want %q", acc, sent, got, want)
			}
			n++
			return
		}
		for k := 1; k <= 3 && k <= len(s); k++ {
			cuts(s[k:], append(acc[:len(acc):len(acc)], s[:k]))
		}
	}
	cuts(text, nil)
	if n == 0 {
		t.Fatal("no cut tried")
	}
}

func TestOutputWithoutTokenizer(t *testing.T) {
	o := newOutput(nil, &request{}, nil)
	o.add(Chunk{Tokens: toks("abc")})
	text, ids, _ := o.take()
	if text != "" || len(ids) != 3 {
		t.Errorf("take = %q, %v", text, ids)
	}
	o.add(Chunk{Tokens: toks("d"), FinishReason: "length"})
	text, ids, _ = o.take()
	if text != "" || !cmp.Equal(ids, []int32{'d'}) || o.finish != "length" {
		t.Errorf("take = %q, %v, finish %q", text, ids, o.finish)
	}
}
