package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
)

// A small synthetic byte-level tokenizer for the options the real fixtures
// do not exercise. Ids 0–255 are the byte-level characters of bytes 0–255;
// merged tokens follow from 256; added tokens are at 300 and up.

func tinyVocab() (map[string]int32, []string) {
	alpha := newByteAlphabet()
	vocab := map[string]int32{}
	for b := 0; b < 256; b++ {
		vocab[string(alpha.toRune[b])] = int32(b)
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l", "Ġwo rl", "Ġworl d"}
	next := int32(256)
	for _, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		if _, ok := vocab[a+b]; !ok {
			vocab[a+b] = next
			next++
		}
	}
	vocab["xyz"] = 290 // reachable only with ignore_merges
	return vocab, merges
}

// tinyJSON returns the tokenizer.json of the synthetic tokenizer as a map
// that tests edit.
func tinyJSON() map[string]any {
	vocab, merges := tinyVocab()
	added := func(id int, content string, special bool) map[string]any {
		return map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": !special, "special": special}
	}
	return map[string]any{
		"version":    "1.0",
		"truncation": nil,
		"padding":    nil,
		"added_tokens": []any{
			added(300, "<s>", true),
			added(301, "</s>", true),
			added(302, "<tool>", false),
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false,
			"trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":   []any{},
			"special_tokens": map[string]any{
				"<s>": map[string]any{"id": "<s>", "ids": []int{300}, "tokens": []string{"<s>"}},
			},
		},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil,
			"continuing_subword_prefix": nil, "end_of_word_suffix": nil, "fuse_unk": false,
			"byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
	}
}

func tinyConfig() map[string]any {
	return map[string]any{
		"bos_token":     "<s>",
		"eos_token":     map[string]any{"__type": "AddedToken", "content": "</s>", "lstrip": false},
		"pad_token":     nil,
		"chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
	}
}

// writeTiny writes the synthetic tokenizer (as edited) into a new
// directory and returns it.
func writeTiny(t *testing.T, tj, cfg map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	for name, v := range map[string]map[string]any{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		if v == nil {
			continue
		}
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func loadTiny(t *testing.T, edit func(tj, cfg map[string]any)) *Tokenizer {
	t.Helper()
	tj, cfg := tinyJSON(), tinyConfig()
	if edit != nil {
		edit(tj, cfg)
	}
	tok, err := Load(writeTiny(t, tj, cfg))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func mustEncode(t *testing.T, tok *Tokenizer, s string, addSpecial bool) []int32 {
	t.Helper()
	ids, err := tok.Encode(s, addSpecial)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestTinyMergesAndPostProcessor(t *testing.T) {
	t.Parallel()
	tok := loadTiny(t, nil)
	vocab, _ := tinyVocab()
	hello, world := vocab["hello"], vocab["Ġworld"]
	if got, want := mustEncode(t, tok, "hello world", false), []int32{hello, world}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if got, want := mustEncode(t, tok, "hello world", true), []int32{300, hello, world}; !slices.Equal(got, want) {
		t.Errorf("Encode with special = %v, want %v", got, want)
	}
	// Added tokens in the text, special or not.
	if got, want := mustEncode(t, tok, "<s>hello<tool></s>", false), []int32{300, hello, 302, 301}; !slices.Equal(got, want) {
		t.Errorf("Encode with added tokens = %v, want %v", got, want)
	}
	if got := tok.Decode([]int32{300, hello, world, 302}); got != "<s>hello world<tool>" {
		t.Errorf("Decode = %q", got)
	}
	if got := mustEncode(t, tok, "xyz", false); !slices.Equal(got, []int32{'x', 'y', 'z'}) {
		t.Errorf("Encode(xyz) without ignore_merges = %v, want the three bytes", got)
	}
	if id, ok := tok.BOS(); !ok || id != 300 {
		t.Errorf("BOS = %d, %v", id, ok)
	}
	if got := tok.EOS(); !slices.Equal(got, []int32{301}) {
		t.Errorf("EOS = %v, want [301] (eos_token given as an AddedToken object)", got)
	}
}

func TestTinyIgnoreMerges(t *testing.T) {
	t.Parallel()
	tok := loadTiny(t, func(tj, _ map[string]any) {
		tj["model"].(map[string]any)["ignore_merges"] = true
	})
	if got := mustEncode(t, tok, "xyz", false); !slices.Equal(got, []int32{290}) {
		t.Errorf("Encode(xyz) with ignore_merges = %v, want [290]", got)
	}
}

func TestTinyMergesAsPairs(t *testing.T) {
	t.Parallel()
	tok := loadTiny(t, func(tj, _ map[string]any) {
		m := tj["model"].(map[string]any)
		var pairs [][2]string
		for _, s := range m["merges"].([]string) {
			a, b, _ := strings.Cut(s, " ")
			pairs = append(pairs, [2]string{a, b})
		}
		m["merges"] = pairs
	})
	vocab, _ := tinyVocab()
	if got, want := mustEncode(t, tok, "hello world", false), []int32{vocab["hello"], vocab["Ġworld"]}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
}

func TestTinyAddBOSToken(t *testing.T) {
	t.Parallel()
	noTemplate := func(tj, cfg map[string]any) {
		tj["post_processor"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}
	}
	tok := loadTiny(t, noTemplate)
	if got := mustEncode(t, tok, "hi", true); !slices.Equal(got, []int32{'h', 'i'}) {
		t.Errorf("ByteLevel post-processor: Encode(hi, true) = %v, want no BOS", got)
	}
	tok = loadTiny(t, func(tj, cfg map[string]any) {
		noTemplate(tj, cfg)
		cfg["add_bos_token"] = true
	})
	if got := mustEncode(t, tok, "hi", true); !slices.Equal(got, []int32{300, 'h', 'i'}) {
		t.Errorf("add_bos_token: Encode(hi, true) = %v, want BOS first", got)
	}
	if got := mustEncode(t, tok, "hi", false); !slices.Equal(got, []int32{'h', 'i'}) {
		t.Errorf("add_bos_token: Encode(hi, false) = %v, want no BOS", got)
	}
	// With a template that adds BOS already, add_bos_token adds no second.
	tok = loadTiny(t, func(_, cfg map[string]any) { cfg["add_bos_token"] = true })
	if got := mustEncode(t, tok, "hi", true); !slices.Equal(got, []int32{300, 'h', 'i'}) {
		t.Errorf("template and add_bos_token: Encode(hi, true) = %v, want one BOS", got)
	}
}

func TestTinyUnknownAndByteFallback(t *testing.T) {
	t.Parallel()
	// A character-level BPE without ByteLevel: "a", "b", "ab", "<unk>" and
	// the byte token of 'c'.
	base := func(tj map[string]any, byteFallback, fuse bool) {
		tj["pre_tokenizer"] = nil
		tj["added_tokens"] = []any{}
		tj["post_processor"] = nil
		tj["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"}}}
		tj["model"] = map[string]any{"type": "BPE", "unk_token": "<unk>", "byte_fallback": byteFallback,
			"fuse_unk": fuse, "vocab": map[string]int{"a": 0, "b": 1, "ab": 2, "<unk>": 3, "<0x63>": 4},
			"merges": []string{"a b"}}
	}
	noConfig := func(cfg map[string]any) {
		delete(cfg, "bos_token")
		delete(cfg, "eos_token")
	}
	for _, c := range []struct {
		name               string
		byteFallback, fuse bool
		text               string
		want               []int32
	}{
		{"unk", false, false, "abxxa", []int32{2, 3, 3, 0}},
		{"fused unk", false, true, "abxxa", []int32{2, 3, 0}},
		{"byte fallback", true, false, "abc", []int32{2, 4}},
		{"byte fallback then unk", true, false, "cxa", []int32{4, 3, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok := loadTiny(t, func(tj, cfg map[string]any) {
				base(tj, c.byteFallback, c.fuse)
				noConfig(cfg)
			})
			if got := mustEncode(t, tok, c.text, true); !slices.Equal(got, c.want) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
			}
		})
	}
	tok := loadTiny(t, func(tj, cfg map[string]any) { base(tj, true, false); noConfig(cfg) })
	if got := tok.Decode([]int32{2, 4}); got != "abc" {
		t.Errorf("Decode with ByteFallback = %q, want abc", got)
	}
}

func TestTinyNormalizedAddedToken(t *testing.T) {
	t.Parallel()
	// A normalized added token matches the normalized text: "é" written
	// decomposed matches the NFC token.
	tok := loadTiny(t, func(tj, _ map[string]any) {
		tj["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}}}
		tj["added_tokens"] = append(tj["added_tokens"].([]any), map[string]any{"id": 303, "content": "caf\u00e9",
			"single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false})
	})
	if got := mustEncode(t, tok, "cafe\u0301!", false); !slices.Equal(got, []int32{303, '!'}) {
		t.Errorf("Encode(NFD café) = %v, want [303 33]", got)
	}
}

// TestAddedTokenOptions checks single_word, lstrip and rstrip on the cases
// that tokenizers documents in its tests of AddedVocabulary.
func TestAddedTokenOptions(t *testing.T) {
	t.Parallel()
	type seg struct {
		text string
		id   int32
	}
	run := func(t *testing.T, toks []addedToken, text string, want []seg) {
		t.Helper()
		v := newAddedVocab(toks, nil)
		var got []seg
		for _, s := range v.appendSegments(nil, text, nil) {
			got = append(got, seg{s.text, s.id})
		}
		if !slices.Equal(got, want) {
			t.Errorf("segments of %q:\n got  %q\n want %q", text, got, want)
		}
	}
	t.Run("lstrip rstrip single_word", func(t *testing.T) {
		toks := []addedToken{
			{ID: 0, Content: "my", LStrip: true, RStrip: true},
			{ID: 1, Content: "name"},
			{ID: 2, Content: "ony", SingleWord: true},
			{ID: 3, Content: "[CLS]", Special: true},
			{ID: 4, Content: "[SEP]", Special: true},
		}
		run(t, toks, "[CLS] my name is anthony [SEP]", []seg{
			{"[CLS]", 3}, {" my ", 0}, {"name", 1}, {" is anthony ", -1}, {"[SEP]", 4},
		})
	})
	t.Run("single_word", func(t *testing.T) {
		toks := []addedToken{{ID: 0, Content: "<mask>", SingleWord: true}}
		run(t, toks, "<mask> my name <mask> a<mask> <mask>ony <mask>", []seg{
			{"<mask>", 0}, {" my name ", -1}, {"<mask>", 0}, {" a<mask> <mask>ony ", -1}, {"<mask>", 0},
		})
		// Punctuation is not a word character; a combining mark is.
		run(t, toks, "<mask>, <mask>- \u25cc\u0330<mask>", []seg{
			{"<mask>", 0}, {", ", -1}, {"<mask>", 0}, {"- \u25cc\u0330<mask>", -1},
		})
	})
	t.Run("unicode spaces", func(t *testing.T) {
		toks := []addedToken{{ID: 0, Content: "<mask>", LStrip: true, RStrip: true, SingleWord: true}}
		run(t, toks, "hi <mask> there\t<mask>\t<mask>\u2000", []seg{
			{"hi", -1}, {" <mask> ", 0}, {"there", -1}, {"\t<mask>\t", 0}, {"<mask>\u2000", 0},
		})
	})
	t.Run("leftmost longest", func(t *testing.T) {
		toks := []addedToken{{ID: 0, Content: "<a>"}, {ID: 1, Content: "<a><b>"}, {ID: 2, Content: "b>"}}
		run(t, toks, "x<a><b>y<a>b>", []seg{
			{"x", -1}, {"<a><b>", 1}, {"y", -1}, {"<a>", 0}, {"b>", 2},
		})
	})
}

// TestSplitBehaviors follows the example of tokenizers' Split
// documentation: "the-final--countdown" split on "-".
func TestSplitBehaviors(t *testing.T) {
	t.Parallel()
	const text = "the-final--countdown"
	for _, c := range []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Removed", false, []string{"the", "final", "countdown"}},
		{"Isolated", false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"MergedWithPrevious", false, []string{"the-", "final-", "-", "countdown"}},
		{"MergedWithNext", false, []string{"the", "-final", "-", "-countdown"}},
		{"Contiguous", false, []string{"the", "-", "final", "--", "countdown"}},
		{"Removed", true, []string{"-", "-", "-"}},
		{"Isolated", true, []string{"the", "-", "final", "-", "-", "countdown"}},
	} {
		lit := "-"
		pat, err := compilePattern(&lit, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := &splitPre{pat: pat, behavior: behaviorNames[c.behavior], invert: c.invert}
		var scratch []span
		if got := p.appendPieces(nil, text, &scratch); !slices.Equal(got, c.want) {
			t.Errorf("%s invert=%v: %q, want %q", c.behavior, c.invert, got, c.want)
		}
	}
}

func TestChatTemplateVariants(t *testing.T) {
	t.Parallel()
	msgs := []model.Message{{Role: "user", Content: "hi"}}
	t.Run("simple", func(t *testing.T) {
		got, err := loadTiny(t, nil).ApplyChatTemplate(msgs, model.ChatOptions{})
		if want := "<s>[user]hi</s>[assistant]"; err != nil || got != want {
			t.Errorf("got %q, %v; want %q", got, err, want)
		}
	})
	t.Run("named list", func(t *testing.T) {
		tok := loadTiny(t, func(_, cfg map[string]any) {
			cfg["chat_template"] = []any{
				map[string]any{"name": "tool_use", "template": "TOOLS"},
				map[string]any{"name": "default", "template": "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}"},
			}
		})
		got, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{})
		if err != nil || got != "user:hi" {
			t.Errorf("got %q, %v; want the default template's output", got, err)
		}
	})
	t.Run("chat_template.jinja", func(t *testing.T) {
		tj, cfg := tinyJSON(), tinyConfig()
		delete(cfg, "chat_template")
		dir := writeTiny(t, tj, cfg)
		if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("J{{ messages[0].content }}"), 0o644); err != nil {
			t.Fatal(err)
		}
		tok, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{}); err != nil || got != "Jhi" {
			t.Errorf("got %q, %v; want Jhi", got, err)
		}
	})
	for _, c := range []struct {
		name     string
		template any
		wantErr  string
	}{
		{"none", nil, "no chat template"},
		{"no default", []any{map[string]any{"name": "rag", "template": "x"}}, `no template named "default"`},
		{"syntax", "{% if %}", "cannot be compiled"},
		{"raise_exception", "{{ raise_exception('roles must alternate') }}", "roles must alternate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok := loadTiny(t, func(_, cfg map[string]any) {
				if c.template == nil {
					delete(cfg, "chat_template")
				} else {
					cfg["chat_template"] = c.template
				}
			})
			_, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{})
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error = %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	set := func(key string, v any) func(tj, cfg map[string]any) {
		return func(tj, _ map[string]any) { tj[key] = v }
	}
	setModel := func(key string, v any) func(tj, cfg map[string]any) {
		return func(tj, _ map[string]any) { tj["model"].(map[string]any)[key] = v }
	}
	for _, c := range []struct {
		name    string
		edit    func(tj, cfg map[string]any)
		wantErr string
	}{
		{"Unigram", setModel("type", "Unigram"), `unsupported type "Unigram"`},
		{"WordPiece", setModel("type", "WordPiece"), `unsupported type "WordPiece"`},
		{"dropout", setModel("dropout", 0.1), "dropout"},
		{"merge out of vocab", setModel("merges", []string{"h e", "q zz"}), `"zz" is not in the vocab`},
		{"bad merge line", setModel("merges", []string{"he"}), "not two tokens"},
		{"unk out of vocab", setModel("unk_token", "<unk>"), `unk_token "<unk>" is not in the vocab`},
		{"no model", set("model", nil), "no model"},
		{"Metaspace", set("pre_tokenizer", map[string]any{"type": "Metaspace"}), `pre_tokenizer: unsupported type "Metaspace"`},
		{"Split after ByteLevel", set("pre_tokenizer", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "ByteLevel"}, map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated"}}}),
			"ByteLevel must be the last"},
		{"bad regex", set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(unclosed"}, "behavior": "Isolated"}), "regex"},
		{"bad behavior", set("pre_tokenizer", map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"}), `behavior "Sideways"`},
		{"Lowercase", set("normalizer", map[string]any{"type": "Lowercase"}), `normalizer: unsupported type "Lowercase"`},
		{"nested BertNormalizer", set("normalizer", map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFC"}, map[string]any{"type": "BertNormalizer"}}}), `unsupported type "BertNormalizer"`},
		{"WordPiece decoder", set("decoder", map[string]any{"type": "WordPiece"}), `decoder: unsupported type "WordPiece"`},
		{"no decoder", set("decoder", nil), "decoder: none"},
		{"TemplateProcessing unknown token", set("post_processor", map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<bos>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}}}),
			`special token "<bos>" is not in special_tokens`},
		{"post_processor type", set("post_processor", map[string]any{"type": "Mystery"}), `post_processor: unsupported type "Mystery"`},
		{"bos not a token", func(_, cfg map[string]any) { cfg["bos_token"] = "<nope>" }, `bos_token "<nope>" is not a token`},
		{"bad add_bos_token", func(_, cfg map[string]any) { cfg["add_bos_token"] = "yes" }, "add_bos_token must be a boolean"},
		{"bad eos_token", func(_, cfg map[string]any) { cfg["eos_token"] = 7 }, "eos_token: want a string"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tj, cfg := tinyJSON(), tinyConfig()
			c.edit(tj, cfg)
			dir := writeTiny(t, tj, cfg)
			_, err := Load(dir)
			if err == nil {
				t.Fatalf("Load succeeded, want an error containing %q", c.wantErr)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q does not contain %q", err, c.wantErr)
			}
			if !strings.Contains(err.Error(), dir) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestLoadMissingAndCorruptFiles(t *testing.T) {
	t.Parallel()
	t.Run("no directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "absent")
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer.json")) || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("error = %v, want a missing tokenizer.json", err)
		}
	})
	t.Run("no tokenizer_config.json", func(t *testing.T) {
		dir := writeTiny(t, tinyJSON(), nil)
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer_config.json")) {
			t.Errorf("error = %v, want a missing tokenizer_config.json", err)
		}
	})
	t.Run("corrupt tokenizer_config.json", func(t *testing.T) {
		dir := writeTiny(t, tinyJSON(), nil)
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"bos_token": `), 0o644)
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), "tokenizer_config.json: invalid JSON") {
			t.Errorf("error = %v, want invalid JSON in tokenizer_config.json", err)
		}
	})
	t.Run("truncated real tokenizer.json", func(t *testing.T) {
		dir := fixtureDir(t, "llama3", nil)
		path := filepath.Join(dir, "tokenizer.json")
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(path, data[:len(data)/2], 0o644)
		_, err = Load(dir)
		if err == nil || !strings.Contains(err.Error(), path+": invalid JSON") {
			t.Errorf("error = %v, want invalid JSON naming %s", err, path)
		}
	})
	t.Run("bad generation_config.json", func(t *testing.T) {
		dir := writeTiny(t, tinyJSON(), tinyConfig())
		os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": "x"}`), 0o644)
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), "generation_config.json: eos_token_id") {
			t.Errorf("error = %v, want a bad eos_token_id", err)
		}
	})
}

func TestGenerationConfigEOS(t *testing.T) {
	t.Parallel()
	dir := writeTiny(t, tinyJSON(), tinyConfig())
	gen := `{"bos_token_id": 300, "eos_token_id": [301, 302, 301]}`
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(gen), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tok.EOS(), []int32{301, 302}; !slices.Equal(got, want) {
		t.Errorf("EOS = %v, want %v", got, want)
	}
}

// TestRegexFallback checks the regexp2 path of Split: a pattern other than
// the GPT-2 family (here the GPT-2 regex wrapped in a group) gives the same
// pieces, with byte offsets right around multi-byte characters.
func TestRegexFallback(t *testing.T) {
	t.Parallel()
	re := "(?:" + gpt2Regex + ")"
	pat, err := compilePattern(nil, &re)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pat.(*regexPattern); !ok {
		t.Fatalf("compilePattern(%q) = %T, want the regexp2 fallback", re, pat)
	}
	viaRegexp2 := loadTiny(t, func(tj, _ map[string]any) {
		tj["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": re}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}}
	})
	builtin := loadTiny(t, nil)
	for _, s := range []string{"hello world", "héllo wörld 😀 x", "  it's 12 \n\n", "中文 and 😀😀 hello"} {
		a, b := mustEncode(t, viaRegexp2, s, false), mustEncode(t, builtin, s, false)
		if !slices.Equal(a, b) {
			t.Errorf("Encode(%q): regexp2 path %v, ByteLevel regex %v", s, a, b)
		}
	}
	lit := "é+"
	p, err := compilePattern(nil, &lit)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.appendMatches(nil, "aéb ééc"), []span{{1, 3}, {5, 9}}; !slices.Equal(got, want) {
		t.Errorf("matches of é+ = %v, want %v (byte offsets)", got, want)
	}
}
