package workerapi

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/model"
)

func checkAppendJSON(t *testing.T, b GenerateBody) {
	t.Helper()
	want, werr := json.Marshal(&b)
	got, gerr := b.AppendJSON([]byte("prefix"))
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("%+v: json.Marshal error %v, AppendJSON error %v", b, werr, gerr)
	}
	if werr != nil {
		return
	}
	if string(got) != "prefix"+string(want) {
		t.Fatalf("%+v:\n got %s\nwant prefix%s", b, got, want)
	}
}

// TestGenerateBodyAppendJSON: AppendJSON writes what json.Marshal writes,
// for both legs' bodies, empty and odd fields included.
func TestGenerateBodyAppendJSON(t *testing.T) {
	for _, b := range []GenerateBody{
		{},
		{RID: "0123456789abcdef0123456789abcdef", InputIDs: []int32{1, 2, 3}, MaxTokens: 16,
			SamplingParams: model.SamplingParams{TopP: 1, Seed: 7}},
		{RID: "r-g2", Room: "00ff", Gen: 2, InputIDs: []int32{}, MaxTokens: 1, StopTokenIDs: []int32{-5, 1 << 30},
			IgnoreEOS: true, MinTokens: 1, PrefillKVAddr: "127.0.0.1:30001", Buffered: true,
			SamplingParams: model.SamplingParams{Temperature: 0.7, TopP: 0.95, TopK: -1, Seed: math.MaxUint64}},
		{RID: "cont", InputIDs: []int32{1, 2, 3}, MaxTokens: 5, MinTokens: 2, ContinuedTokens: 2, Buffered: true,
			SamplingParams: model.SamplingParams{Temperature: 0.8, TopP: 1, Seed: 11}},
		{RID: "q\"\\\n\r\t\b\f\x01<>&\u2028\u2029é\xff", SamplingParams: model.SamplingParams{Temperature: 1e-7, TopP: 3e21}},
		{SamplingParams: model.SamplingParams{Temperature: 1e-6, TopP: 123456789}},
		{SamplingParams: model.SamplingParams{Temperature: float32(math.NaN())}},
		{SamplingParams: model.SamplingParams{TopP: float32(math.Inf(1))}},
	} {
		checkAppendJSON(t, b)
	}
}

func FuzzGenerateBodyAppendJSON(f *testing.F) {
	f.Add("rid", "room", uint32(1), int32(5), 16, float32(0.5), float32(1), 3, uint64(9), true, "a:1", false, 4, uint8(0), "", false, 0)
	f.Add("\x00\xff<", "", uint32(0), int32(-1), 0, float32(1e-9), float32(1e22), -2, uint64(0), false, "", true, -3, uint8(1), `{"type":"object"}`, true, 1)
	f.Fuzz(func(t *testing.T, rid, room string, gen uint32, id int32, maxTokens int, temp, topP float32, topK int,
		seed uint64, ignore bool, kv string, buffered bool, minTokens int, kind uint8, src string, flex bool, continued int) {
		b := GenerateBody{RID: rid, Room: room, Gen: gen, InputIDs: []int32{id, id / 2}, MaxTokens: maxTokens,
			SamplingParams: model.SamplingParams{Temperature: temp, TopP: topP, TopK: topK, Seed: seed},
			StopTokenIDs:   []int32{id}, IgnoreEOS: ignore, MinTokens: minTokens, PrefillKVAddr: kv, Buffered: buffered,
			ContinuedTokens: continued}
		if kind > 0 {
			// (Kind 7 is none: written "kind(7)", as json.Marshal does.)
			b.Constraint = &grammar.Spec{Kind: grammar.Kind(kind % 8), Source: src, FlexibleWhitespace: flex}
		}
		checkAppendJSON(t, b)
	})
}

// decodePlain decodes data as encoding/json does, without UnmarshalJSON.
func decodePlain(data []byte) (GenerateBody, error) {
	type plain GenerateBody
	var p plain
	err := json.Unmarshal(data, &p)
	return GenerateBody(p), err
}

// TestParseGenerateBody: bodies as AppendJSON writes them (both legs',
// every field set and none) take the fast path, to encoding/json's result;
// other shapes fall back, and still decode as encoding/json decodes them.
func TestParseGenerateBody(t *testing.T) {
	for _, b := range []GenerateBody{
		{RID: "0123456789abcdef0123456789abcdef", InputIDs: []int32{1, 2, 3}, MaxTokens: 16,
			SamplingParams: model.SamplingParams{TopP: 1, Seed: 7}},
		{RID: "r-g2", Room: "00ff", Gen: math.MaxUint32, InputIDs: []int32{}, MaxTokens: 1, StopTokenIDs: []int32{-5, math.MaxInt32, math.MinInt32},
			IgnoreEOS: true, MinTokens: 1, PrefillKVAddr: "127.0.0.1:30001", Buffered: true,
			SamplingParams: model.SamplingParams{Temperature: 0.7, TopP: 0.95, TopK: -1, Seed: math.MaxUint64}},
		{SamplingParams: model.SamplingParams{Temperature: 1e-7, TopP: 3e21}},
		{InputIDs: nil},
		{RID: "c", InputIDs: []int32{4, 5, 6, 7}, MaxTokens: 3, MinTokens: 1, ContinuedTokens: 3,
			SamplingParams: model.SamplingParams{Temperature: 0.9, TopP: 1, Seed: 5}},
	} {
		data, err := b.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		var got GenerateBody
		if !parseGenerateBody(data, &got) {
			t.Fatalf("%s: not taken by the fast path", data)
		}
		want, err := decodePlain(data)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\n fast %+v\n json %+v", data, got, want)
		}
	}
	for _, tc := range []struct {
		data string
		fast bool
	}{
		{` { "rid" : "a" , "input_ids" : [ 1 , 2 ] , "rid":"b", "max_tokens": -0 } `, true},
		{`{}`, true},
		{`{"RID":"a"}`, false},                   // case-insensitive key: encoding/json's
		{`{"rid":"a\u0041"}`, false},             // an escape
		{`{"rid":"é"}`, false},                   // not ASCII
		{`{"unknown":1}`, false},                 // ignored by encoding/json
		{`{"max_tokens":1.0}`, false},            // an error from encoding/json
		{`{"gen":-1}`, false},                    // an error
		{`{"gen":4294967296}`, false},            // out of range: an error
		{`{"input_ids":[2147483648]}`, false},    // out of range: an error
		{`{"temperature":1e39}`, false},          // beyond float32: an error
		{`{"input_ids":null}`, true},             // null: nil
		{`{"rid":null}`, false},                  // null
		{`{"rid":"a",}`, false},                  // malformed
		{`{"max_tokens":01}`, false},             // malformed
		{`{"temperature":.5}`, false},            // malformed
		{`{"rid":"a"} x`, false},                 // trailing data
		{`{"ignore_eos":tru}`, false},            // malformed
		{`{"stop_token_ids":[1,]}`, false},       // malformed
		{`{"seed":18446744073709551615}`, true},  // the largest seed
		{`{"temperature":1E-3,"top_p":0}`, true}, // exponent, and top_p 0
		{`{"continued_tokens":3}`, true},
		{`{"continued_tokens":-1}`, true},   // read; the worker refuses it
		{`{"continued_tokens":2.0}`, false}, // an error
		{`{"continued_tokens":"2"}`, false}, // an error
	} {
		var got GenerateBody
		if fast := parseGenerateBody([]byte(tc.data), &got); fast != tc.fast {
			t.Errorf("%s: fast path %v, want %v", tc.data, fast, tc.fast)
		}
		var viaMethod GenerateBody
		merr := json.Unmarshal([]byte(tc.data), &viaMethod)
		want, werr := decodePlain([]byte(tc.data))
		if (merr != nil) != (werr != nil) {
			t.Errorf("%s: UnmarshalJSON error %v, encoding/json's %v", tc.data, merr, werr)
			continue
		}
		if werr == nil {
			if want.TopP == 0 {
				want.TopP = 1
			}
			if !reflect.DeepEqual(viaMethod, want) {
				t.Errorf("%s:\n got %+v\nwant %+v", tc.data, viaMethod, want)
			}
		}
	}
}

// FuzzParseGenerateBody: whatever the fast path takes, encoding/json takes
// too, with the same result.
func FuzzParseGenerateBody(f *testing.F) {
	for _, s := range []string{`{"rid":"r","room":"00","gen":2,"input_ids":[1,2],"max_tokens":4,"temperature":0.5,` +
		`"top_p":0.9,"top_k":3,"seed":7,"stop_token_ids":[9],"ignore_eos":true,"min_tokens":1,"prefill_kv_addr":"a:1","buffered":true,` +
		`"continued_tokens":1}`,
		`{}`, ` {"input_ids" : [ ] } `, `{"max_tokens":-0,"temperature":1e-3}`, `{"seed":18446744073709551616}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got GenerateBody
		if !parseGenerateBody(data, &got) {
			return
		}
		want, err := decodePlain(data)
		if err != nil {
			t.Fatalf("%q: the fast path took what encoding/json refuses: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n fast %+v\n json %+v", data, got, want)
		}
	})
}

// TestExtendedBody: a leg that uses the later fields (choices, logprobs,
// logit processors, prompt logprobs, priority, timeout) is written as
// json.Marshal writes it and reads back whole, and names the features its
// worker needs.
func TestExtendedBody(t *testing.T) {
	three := 3
	b := GenerateBody{RID: "r", Room: "00ff", Gen: 1, InputIDs: []int32{1, 2}, MaxTokens: 8, N: 4, PromptLogprobs: &three,
		Priority: -2, TimeoutMS: 1500,
		Constraint: &grammar.Spec{Kind: grammar.KindJSONSchema, Source: `{"type":"object","properties":{"b":{},"a":{}}}`, FlexibleWhitespace: true},
		SamplingParams: model.SamplingParams{Temperature: 0.5, TopP: 1, Seed: 3, MinP: 0.1, PresencePenalty: 0.5,
			FrequencyPenalty: -0.5, RepetitionPenalty: 1.2, LogitBias: []model.LogitBias{{ID: 1, Bias: -100}, {ID: 7, Bias: 2.5}},
			AllowedTokenIDs: []int32{1, 2, 7}, BadWords: [][]int32{{4}, {5, 6}}, TopLogprobs: 5, LogprobsMode: model.LogprobsProcessed}}
	checkAppendJSON(t, b)
	data, err := b.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got GenerateBody
	if err := got.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, b) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, b)
	}
	want := []string{FeatureLogprobs, FeatureChoices, FeaturePromptLogprobs, FeatureLogitProcessors, FeaturePriority, FeatureTimeout,
		FeatureConstraint}
	if f := FeaturesOf(&b); !reflect.DeepEqual(f, want) {
		t.Fatalf("FeaturesOf = %v, want %v", f, want)
	}
	for _, f := range want {
		found := false
		for _, g := range Features() {
			found = found || g == f
		}
		if !found {
			t.Fatalf("this build's workers do not list %q", f)
		}
	}
	if f := FeaturesOf(&GenerateBody{MaxTokens: 1, SamplingParams: model.SamplingParams{RepetitionPenalty: 1}}); f != nil {
		t.Fatalf("a first-version body needs %v", f)
	}
	if f := FeaturesOf(&GenerateBody{MaxTokens: 0}); !reflect.DeepEqual(f, []string{FeaturePromptLogprobs}) {
		t.Fatalf("a prompt-only leg needs %v", f)
	}
}

// TestConstraintBody: a leg with a constraint writes it as
// {"kind","source","flexible_whitespace"} (what json.Marshal writes), reads
// it back unchanged whatever the kind, and needs the constraint feature; a
// leg without one has no constraint key and takes the fast path.
func TestConstraintBody(t *testing.T) {
	for _, c := range []grammar.Spec{
		{Kind: grammar.KindJSONObject},
		{Kind: grammar.KindJSONSchema, Source: `{"type":"string","pattern":"<a&b>\\d"}`},
		{Kind: grammar.KindRegex, Source: "[a-z]+\u2028\xff"},
		{Kind: grammar.KindChoice, Source: `["yes","no"]`},
		{Kind: grammar.KindGBNF, Source: "root ::= \"a\"\n"},
		{Kind: grammar.KindLark, Source: `start: "a"`},
	} {
		b := GenerateBody{RID: "r", InputIDs: []int32{1}, MaxTokens: 4, Constraint: &c,
			SamplingParams: model.SamplingParams{TopP: 1, Seed: 1}}
		checkAppendJSON(t, b)
		data, err := b.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), `"constraint":{"kind":"`+c.Kind.String()+`"`) {
			t.Fatalf("%s: no constraint of kind %s", data, c.Kind)
		}
		var got GenerateBody
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		want := c
		if !utf8.ValidString(want.Source) {
			want.Source = strings.ToValidUTF8(want.Source, "\ufffd") // as encoding/json writes it
		}
		if got.Constraint == nil || *got.Constraint != want || got.Constraint.Digest() != want.Digest() {
			t.Fatalf("%s: read back %+v, want %+v", data, got.Constraint, want)
		}
		if f := FeaturesOf(&got); !reflect.DeepEqual(f, []string{FeatureConstraint}) {
			t.Fatalf("FeaturesOf = %v", f)
		}
	}
	plain := GenerateBody{RID: "r", InputIDs: []int32{1}, MaxTokens: 4, SamplingParams: model.SamplingParams{TopP: 1}}
	data, err := plain.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got GenerateBody
	if strings.Contains(string(data), "constraint") || !parseGenerateBody(data, &got) || got.Constraint != nil {
		t.Fatalf("%s: %+v", data, got)
	}
	if err := json.Unmarshal([]byte(`{"rid":"r","constraint":{"kind":"xml","source":"a"}}`), &GenerateBody{}); err == nil {
		t.Fatal("an unknown constraint kind was read")
	}
}

// TestContinuedBody: a continuation leg is written by AppendJSON as
// json.Marshal writes it (continued_tokens last), taken by the fast path
// and read back whole by UnmarshalJSON and by encoding/json; with the later
// fields it goes through encoding/json and still reads back. It needs the
// continue feature, which this build's workers list; a body without it
// has no continued_tokens key.
func TestContinuedBody(t *testing.T) {
	b := GenerateBody{RID: "r", InputIDs: []int32{1, 2, 3, 9}, MaxTokens: 4, MinTokens: 1, ContinuedTokens: 2,
		SamplingParams: model.SamplingParams{Temperature: 0.7, TopP: 1, Seed: 42}}
	checkAppendJSON(t, b)
	data, err := b.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(data), `,"continued_tokens":2}`) {
		t.Fatalf("%s: continued_tokens not written last", data)
	}
	var fast GenerateBody
	if !parseGenerateBody(data, &fast) || !reflect.DeepEqual(fast, b) {
		t.Fatalf("fast path: %+v, want %+v", fast, b)
	}
	var viaMethod GenerateBody
	if err := json.Unmarshal(data, &viaMethod); err != nil || !reflect.DeepEqual(viaMethod, b) {
		t.Fatalf("UnmarshalJSON: %+v (%v), want %+v", viaMethod, err, b)
	}
	plain, err := decodePlain(data)
	if err != nil || plain.ContinuedTokens != 2 {
		t.Fatalf("encoding/json: %+v (%v)", plain, err)
	}
	if f := FeaturesOf(&b); !reflect.DeepEqual(f, []string{FeatureMinTokens, FeatureContinue}) {
		t.Fatalf("FeaturesOf = %v", f)
	}
	if !slices.Contains(Features(), FeatureContinue) {
		t.Fatalf("Features() = %v lacks %q", Features(), FeatureContinue)
	}

	ext := b
	ext.SamplingParams.PresencePenalty = 0.5
	ext.Constraint = &grammar.Spec{Kind: grammar.KindJSONObject}
	checkAppendJSON(t, ext)
	data, err = ext.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	var got GenerateBody
	if err := json.Unmarshal(data, &got); err != nil || !reflect.DeepEqual(got, ext) {
		t.Fatalf("extended round trip: %+v (%v), want %+v", got, err, ext)
	}

	b.ContinuedTokens = 0
	data, err = b.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "continued_tokens") || slices.Contains(FeaturesOf(&b), FeatureContinue) {
		t.Fatalf("%s: a fresh leg marked as a continuation (%v)", data, FeaturesOf(&b))
	}
}
