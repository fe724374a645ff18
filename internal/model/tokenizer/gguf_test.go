package tokenizer

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
)

// ggufFromFixture writes the GGUF tokenizer metadata llama.cpp's converter
// makes from fixture name's tokenizer.json and tokenizer_config.json, and
// parses it back.
func ggufFromFixture(t *testing.T, name, pre string, addBOS bool) *gguf.File {
	t.Helper()
	raw, err := gunzipFile(name, "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var j struct {
		Model struct {
			Vocab  map[string]int32 `json:"vocab"`
			Merges []json.RawMessage
		} `json:"model"`
		Added []addedToken `json:"added_tokens"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		t.Fatal(err)
	}
	cfgRaw, err := gunzipFile(name, "tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		BOS  string `json:"bos_token"`
		EOS  string `json:"eos_token"`
		Chat string `json:"chat_template"`
	}
	if err := json.Unmarshal(cfgRaw, &cfg); err != nil {
		t.Fatal(err)
	}
	n := len(j.Model.Vocab)
	for _, a := range j.Added {
		n = max(n, int(a.ID)+1)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	byText := map[string]uint32{}
	for tok, id := range j.Model.Vocab {
		tokens[id], types[id] = tok, ggufNormal
	}
	for _, a := range j.Added {
		tokens[a.ID], types[a.ID] = a.Content, ggufControl
		if !a.Special {
			types[a.ID] = ggufUserDefined
		}
	}
	for i, tok := range tokens {
		if tok == "" {
			tokens[i], types[i] = "[PAD"+string(rune('0'+i%10))+"]", ggufUnused
		}
		byText[tok] = uint32(i)
	}
	var merges []string
	for _, m := range j.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) == nil {
			merges = append(merges, s)
			continue
		}
		var p []string
		if err := json.Unmarshal(m, &p); err != nil || len(p) != 2 {
			t.Fatalf("merge %s", m)
		}
		merges = append(merges, p[0]+" "+p[1])
	}
	kvs := []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: "gpt2"}, {Key: "tokenizer.ggml.pre", Value: pre},
		{Key: "tokenizer.ggml.tokens", Value: tokens}, {Key: "tokenizer.ggml.token_type", Value: types},
		{Key: "tokenizer.ggml.merges", Value: merges},
		{Key: "tokenizer.ggml.eos_token_id", Value: byText[cfg.EOS]},
		{Key: "tokenizer.ggml.add_bos_token", Value: addBOS},
		{Key: "tokenizer.chat_template", Value: cfg.Chat},
	}
	if cfg.BOS != "" {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.bos_token_id", Value: byText[cfg.BOS]})
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kvs, nil); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestGGUFBPEMatchesTokenizerJSON builds the Llama 3 and Qwen3 tokenizers
// from GGUF metadata (as llama.cpp's converter writes it) and checks every
// fixture case against what transformers.js computes, with and without
// special tokens, plus decoding and the chat template.
func TestGGUFBPEMatchesTokenizerJSON(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, pre string
		addBOS    bool
	}{{"llama3", "llama-bpe", false}, {"qwen3", "qwen2", false}} { // these fixtures' post-processors add no BOS
		t.Run(c.name, func(t *testing.T) {
			tok, err := FromGGUF(ggufFromFixture(t, c.name, c.pre, c.addBOS))
			if err != nil {
				t.Fatal(err)
			}
			exp := readExpected(t, c.name)
			for i, e := range exp.Encode {
				for _, special := range []bool{false, true} {
					want := e.IDs
					if special {
						want = e.IDsSpecial
					}
					got, err := tok.Encode(e.Text, special)
					if err != nil {
						t.Fatal(err)
					}
					if !equalIDs(got, want) {
						t.Fatalf("%s special=%v: %s", caseName(i, e.Text), special, firstDiff(tok, got, want))
					}
				}
				if d := tok.Decode(e.IDs); d != e.Decoded {
					t.Fatalf("%s: Decode = %q, want %q", caseName(i, e.Text), d, e.Decoded)
				}
			}
			for i, ch := range exp.Chat {
				var msgs []model.Message
				for _, m := range ch.Messages {
					msgs = append(msgs, model.Message{Role: m.Role, Content: m.Content})
				}
				got, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if got != ch.Text {
					t.Fatalf("chat %d: %q, want %q", i, got, ch.Text)
				}
			}
			if len(tok.EOS()) == 0 {
				t.Error("no EOS")
			}
		})
	}
}

// spmFile writes a small SentencePiece vocabulary as GGUF metadata.
func spmFile(t *testing.T, extra ...gguf.KV) *gguf.File {
	t.Helper()
	tokens := []string{"<unk>", "<s>", "</s>"}
	types := []int32{ggufUnknown, ggufControl, ggufControl}
	for b := range 256 {
		tokens = append(tokens, "<0x"+strings.ToUpper(string("0123456789abcdef"[b>>4])+string("0123456789abcdef"[b&15]))+">")
		types = append(types, ggufByte)
	}
	pieces := []string{"▁", "h", "e", "l", "o", "▁h", "he", "ll", "llo", "▁he", "▁hello", "▁w", "or", "ld", "▁wor", "▁world", "w", "r", "d", "el", "hel"}
	scores := make([]float32, len(tokens))
	for i, p := range pieces {
		tokens = append(tokens, p)
		types = append(types, ggufNormal)
		scores = append(scores, -float32(i))
	}
	// "▁hello" outscores its parts; "hel" (last) loses to "he".
	kvs := append([]gguf.KV{
		{Key: "tokenizer.ggml.model", Value: "llama"}, {Key: "tokenizer.ggml.tokens", Value: tokens},
		{Key: "tokenizer.ggml.scores", Value: scores}, {Key: "tokenizer.ggml.token_type", Value: types},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)}, {Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: uint32(0)},
	}, extra...)
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kvs, nil); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestGGUFSentencePiece checks the SentencePiece tokenizer on a small
// vocabulary: the space prefix, score-ordered merges, byte fallback,
// special tokens in the text, BOS, and decoding back.
func TestGGUFSentencePiece(t *testing.T) {
	t.Parallel()
	tok, err := FromGGUF(spmFile(t))
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int32 {
		for i, x := range tok.idTokens {
			if x == s {
				return int32(i)
			}
		}
		t.Fatalf("no token %q", s)
		return -1
	}
	for _, c := range []struct {
		text    string
		special bool
		want    []string
	}{
		{"hello world", false, []string{"▁hello", "▁world"}},
		{"hello world", true, []string{"<s>", "▁hello", "▁world"}},
		{"hel", false, []string{"▁he", "l"}},
		{"héllo", false, []string{"▁h", "<0xC3>", "<0xA9>", "llo"}},
		{"hello</s>world", false, []string{"▁hello", "</s>", "▁world"}},
		{"", true, []string{"<s>"}},
		{"  hello", false, []string{"▁", "▁", "▁hello"}},
	} {
		got, err := tok.Encode(c.text, c.special)
		if err != nil {
			t.Fatal(err)
		}
		var want []int32
		for _, s := range c.want {
			want = append(want, id(s))
		}
		if !equalIDs(got, want) {
			var names []string
			for _, g := range got {
				names = append(names, tok.TokenString(g))
			}
			t.Errorf("Encode(%q, %v) = %q, want %q", c.text, c.special, names, c.want)
		}
		if !c.special {
			if d := tok.Decode(got); d != " "+c.text && !strings.Contains(c.text, "</s>") {
				t.Errorf("Decode(Encode(%q)) = %q", c.text, d)
			}
		}
	}
	if b, ok := tok.BOS(); !ok || b != 1 || !equalIDs(tok.EOS(), []int32{2}) {
		t.Errorf("BOS %d %v, EOS %v", b, ok, tok.EOS())
	}
	// Control and unknown tokens are special; bytes and pieces are not.
	for _, c := range []struct {
		tok     string
		special bool
	}{{"<unk>", true}, {"<s>", true}, {"</s>", true}, {"<0x41>", false}, {"▁hello", false}} {
		if got := tok.IsSpecial(id(c.tok)); got != c.special {
			t.Errorf("IsSpecial(%q) = %v, want %v", c.tok, got, c.special)
		}
	}
	noSpace, err := FromGGUF(spmFile(t, gguf.KV{Key: "tokenizer.ggml.add_space_prefix", Value: false}, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: false}))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := noSpace.Encode("hello", true); !equalIDs(got, []int32{id("hel"), id("l"), id("o")}) && !equalIDs(got, []int32{id("he"), id("llo")}) {
		t.Errorf("without the space prefix: %v", got)
	}
	if _, err := tok.ApplyChatTemplate([]model.Message{{Role: "user", Content: "hi"}}, model.ChatOptions{}); err == nil || !strings.Contains(err.Error(), "tokenizer.chat_template") {
		t.Errorf("no template: %v", err)
	}
}

// TestGGUFTokenizerErrors checks that bad tokenizer metadata is refused
// with an error naming the key.
func TestGGUFTokenizerErrors(t *testing.T) {
	t.Parallel()
	parse := func(kvs ...gguf.KV) *gguf.File {
		var buf bytes.Buffer
		if err := gguf.Write(&buf, kvs, nil); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	toks := gguf.KV{Key: "tokenizer.ggml.tokens", Value: []string{"a", "b", "ab"}}
	for _, c := range []struct {
		f    *gguf.File
		want string
	}{
		{parse(), "no tokenizer.ggml.model"},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "bert"}, toks), `tokenizer.ggml.model "bert" is not supported`},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "gpt2"}), "no tokenizer.ggml.tokens"},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "gpt2"}, toks), "tokenizer.ggml.merges"},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "gpt2"}, toks, gguf.KV{Key: "tokenizer.ggml.pre", Value: "klingon"}), `tokenizer.ggml.pre "klingon" is not supported`},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "gpt2"}, toks, gguf.KV{Key: "tokenizer.ggml.merges", Value: []string{"a c"}}), `"c" is not in the vocab`},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "gpt2"}, toks, gguf.KV{Key: "tokenizer.ggml.merges", Value: []string{"ab"}}), `is not "left right"`},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "llama"}, toks), "tokenizer.ggml.scores: want 3 float32 values"},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "llama"}, toks, gguf.KV{Key: "tokenizer.ggml.scores", Value: []float32{0, 0, 0}},
			gguf.KV{Key: "tokenizer.ggml.eos_token_id", Value: uint32(9)}), "tokenizer.ggml.eos_token_id 9 is outside the vocabulary [0, 3)"},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "llama"}, toks, gguf.KV{Key: "tokenizer.ggml.scores", Value: []float32{0, 0, 0}},
			gguf.KV{Key: "tokenizer.ggml.token_type", Value: []int32{1}}), "tokenizer.ggml.token_type: want 3 int32 values"},
		{parse(gguf.KV{Key: "tokenizer.ggml.model", Value: "llama"}, toks, gguf.KV{Key: "tokenizer.ggml.scores", Value: []float32{0, 0, 0}},
			gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: uint32(1)}), "tokenizer.ggml.add_bos_token is an integer, want a bool"},
	} {
		if _, err := FromGGUF(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want it to contain %q", err, c.want)
		}
	}
}
