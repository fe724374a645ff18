package workerapi

import (
	"encoding/json"
	"math"
	"testing"

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
		{RID: "q\"\\\n\r\t\b\f\x01<>&\u2028\u2029é\xff", SamplingParams: model.SamplingParams{Temperature: 1e-7, TopP: 3e21}},
		{SamplingParams: model.SamplingParams{Temperature: 1e-6, TopP: 123456789}},
		{SamplingParams: model.SamplingParams{Temperature: float32(math.NaN())}},
		{SamplingParams: model.SamplingParams{TopP: float32(math.Inf(1))}},
	} {
		checkAppendJSON(t, b)
	}
}

func FuzzGenerateBodyAppendJSON(f *testing.F) {
	f.Add("rid", "room", uint32(1), int32(5), 16, float32(0.5), float32(1), 3, uint64(9), true, "a:1", false, 4)
	f.Add("\x00\xff<", "", uint32(0), int32(-1), 0, float32(1e-9), float32(1e22), -2, uint64(0), false, "", true, -3)
	f.Fuzz(func(t *testing.T, rid, room string, gen uint32, id int32, maxTokens int, temp, topP float32, topK int,
		seed uint64, ignore bool, kv string, buffered bool, minTokens int) {
		checkAppendJSON(t, GenerateBody{RID: rid, Room: room, Gen: gen, InputIDs: []int32{id, id / 2}, MaxTokens: maxTokens,
			SamplingParams: model.SamplingParams{Temperature: temp, TopP: topP, TopK: topK, Seed: seed},
			StopTokenIDs:   []int32{id}, IgnoreEOS: ignore, MinTokens: minTokens, PrefillKVAddr: kv, Buffered: buffered})
	})
}
