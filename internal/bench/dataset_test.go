package bench

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestRandomDataset(t *testing.T) {
	cfg := testConfig("http://x")
	cfg.RandomInputLen, cfg.RandomOutputLen, cfg.RandomRangeRatio = 100, 20, 0.5
	ps, err := BuildDataset(&cfg, 2000, streamDataset)
	if err != nil {
		t.Fatal(err)
	}
	var sumIn, sumOut float64
	for _, p := range ps {
		if len(p.Text) != p.InputLen || p.InputLen < 50 || p.InputLen > 150 || p.OutputLen < 10 || p.OutputLen > 30 {
			t.Fatalf("prompt of %d bytes, planned %d, output %d: outside [len·(1−r), len·(1+r)]", len(p.Text), p.InputLen, p.OutputLen)
		}
		if strings.ContainsFunc(p.Text, func(r rune) bool { return r != ' ' && (r < 'a' || r > 'z') }) {
			t.Fatalf("prompt is not lowercase ASCII words: %q", p.Text)
		}
		sumIn += float64(p.InputLen)
		sumOut += float64(p.OutputLen)
	}
	if m := sumIn / 2000; math.Abs(m-100) > 3 {
		t.Errorf("mean input %.1f, want 100 ± 3", m)
	}
	if m := sumOut / 2000; math.Abs(m-20) > 1 {
		t.Errorf("mean output %.1f, want 20 ± 1", m)
	}
	again, _ := BuildDataset(&cfg, 2000, streamDataset)
	if !reflect.DeepEqual(ps, again) {
		t.Fatal("the same seed gave another dataset")
	}

	cfg.RandomRangeRatio = 0
	ps, _ = BuildDataset(&cfg, 10, streamDataset)
	for _, p := range ps {
		if p.InputLen != 100 || p.OutputLen != 20 || len(p.Text) != 100 {
			t.Fatalf("ratio 0 must give exact lengths: %d %d", p.InputLen, p.OutputLen)
		}
	}
}

func TestConversationDataset(t *testing.T) {
	cfg := testConfig("http://x")
	cfg.Dataset = DatasetConversation
	ps, err := BuildDataset(&cfg, 20000, streamDataset)
	if err != nil {
		t.Fatal(err)
	}
	var sumIn, sumOut float64
	for _, p := range ps {
		if p.InputLen < ConvMinLen || p.OutputLen < ConvMinLen || p.InputLen > ConvMaxInput || p.InputLen+p.OutputLen > ConvMaxTotal {
			t.Fatalf("lengths %d, %d outside the filter", p.InputLen, p.OutputLen)
		}
		sumIn += float64(p.InputLen)
		sumOut += float64(p.OutputLen)
	}
	// The means documented on ConversationLengths.
	if m := sumIn / 20000; math.Abs(m-217) > 8 {
		t.Errorf("mean prompt length %.1f, want about 217", m)
	}
	if m := sumOut / 20000; math.Abs(m-198) > 8 {
		t.Errorf("mean output length %.1f, want about 198", m)
	}
}

func TestLoadJSONL(t *testing.T) {
	in := `{"prompt": "a", "output_len": 3}

{"prompt": "bb"}
{"prompt": "ccc", "output_len": 0, "extra": true}
`
	ps, err := LoadJSONL(strings.NewReader(in), 10, 7)
	if err != nil {
		t.Fatal(err)
	}
	want := []Prompt{{Text: "a", InputLen: 1, OutputLen: 3, Group: -1}, {Text: "bb", InputLen: 2, OutputLen: 7, Group: -1},
		{Text: "ccc", InputLen: 3, OutputLen: 7, Group: -1}}
	if len(ps) != len(want) {
		t.Fatalf("got %v", ps)
	}
	for i := range want {
		if !reflect.DeepEqual(ps[i], want[i]) {
			t.Errorf("record %d: %+v, want %+v", i, ps[i], want[i])
		}
	}
	if ps, _ := LoadJSONL(strings.NewReader(in), 2, 7); len(ps) != 2 {
		t.Errorf("limit 2 read %d records", len(ps))
	}
	for _, bad := range []struct{ in, want string }{
		{`{"prompt": "a"}` + "\n" + `{"prompt": 5}`, "line 2"},
		{`{"output_len": 3}`, `"prompt"`},
		{`{"prompt": "a", "output_len": -1}`, "output_len"},
		{`not json`, "line 1"},
		{"\n\n", "no records"},
		{`{"prompt": "` + strings.Repeat("x", MaxJSONLLineBytes) + `"}`, "longer than"},
	} {
		if _, err := LoadJSONL(strings.NewReader(bad.in), 10, 7); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("LoadJSONL(%.40q): %v, want an error mentioning %q", bad.in, err, bad.want)
		}
	}
}

func TestJSONLDatasetCycles(t *testing.T) {
	cfg := testConfig("http://x")
	cfg.Dataset, cfg.DatasetPath = DatasetJSONL, writeJSONL(t, []string{"one", "two"}, 5)
	ps, err := BuildDataset(&cfg, 5, streamDataset)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.Text)
	}
	if strings.Join(got, ",") != "one,two,one,two,one" {
		t.Fatalf("got %v, want the records in file order, repeated", got)
	}
}

func TestParseRates(t *testing.T) {
	r, err := ParseRates([]string{"1,2.5", " inf", "8"})
	if err != nil || len(r) != 4 || r[0] != 1 || r[1] != 2.5 || !r[2].IsInf() || r[3] != 8 {
		t.Fatalf("got %v %v", r, err)
	}
	for _, bad := range [][]string{{"0"}, {"-1"}, {"fast"}, {""}, {"NaN"}, {"1,,x"}} {
		if _, err := ParseRates(bad); err == nil {
			t.Errorf("ParseRates(%q) accepted", bad)
		}
	}
	b, err := json.Marshal([]Rate{InfRate(), 2.5})
	if err != nil || string(b) != `["inf",2.5]` {
		t.Fatalf("marshal: %s %v", b, err)
	}
	var back []Rate
	if err := json.Unmarshal(b, &back); err != nil || !back[0].IsInf() || back[1] != 2.5 {
		t.Fatalf("unmarshal: %v %v", back, err)
	}
}

func TestValidate(t *testing.T) {
	ok := testConfig("http://127.0.0.1:1")
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"base url", func(c *Config) { c.BaseURL = "localhost:8000" }, "base URL"},
		{"endpoint", func(c *Config) { c.Endpoint = "embeddings" }, "endpoint"},
		{"prompts", func(c *Config) { c.NumPrompts = 0 }, "number of prompts"},
		{"rate", func(c *Config) { c.Rates = []Rate{0} }, "request rate"},
		{"no rate", func(c *Config) { c.Rates = nil }, "no request rate"},
		{"concurrency", func(c *Config) { c.MaxConcurrency = -1 }, "concurrency"},
		{"dataset", func(c *Config) { c.Dataset = "sharegpt" }, "dataset"},
		{"jsonl path", func(c *Config) { c.Dataset = DatasetJSONL }, "dataset path"},
		{"ratio", func(c *Config) { c.RandomRangeRatio = 1 }, "range ratio"},
		{"input", func(c *Config) { c.RandomInputLen = 0 }, "input length"},
		{"output", func(c *Config) { c.RandomOutputLen = 0 }, "output length"},
		{"timeout", func(c *Config) { c.Timeout = 0 }, "timeout"},
		{"slo", func(c *Config) { c.SLOTTFT = -time.Second }, "SLO"},
		{"response_format array", func(c *Config) { c.ResponseFormat = json.RawMessage(`[{"type":"json_object"}]`) }, "response_format"},
		{"response_format null", func(c *Config) { c.ResponseFormat = json.RawMessage(`null`) }, "response_format"},
		{"response_format not JSON", func(c *Config) { c.ResponseFormat = json.RawMessage(`{"type":`) }, "response_format"},
	}
	for _, c := range cases {
		cfg := ok
		c.edit(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error mentioning %q", c.name, err, c.want)
		}
	}
	for _, u := range []string{"http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"} {
		c := Config{BaseURL: u}
		if got := c.baseURL(); got != "http://h:1" {
			t.Errorf("baseURL(%q) = %q", u, got)
		}
	}
}
