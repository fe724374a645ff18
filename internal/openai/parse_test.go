package openai

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/pdserve/pdserve/internal/model"
)

const testContextLen = 64

func testParser() *parser {
	return &parser{modelName: "m", tok: byteTokenizer{}, contextLen: testContextLen, newSeed: func() uint64 { return 42 },
		maxLogprobs: DefaultMaxLogprobs}
}

func noTokParser() *parser {
	p := testParser()
	p.tok = nil
	return p
}

type badCase struct {
	name   string
	body   string
	status int
	param  string // "-" = don't check
	msg    string // substring of the message
}

func checkBad(t *testing.T, parse func(string) (*request, error), tests []badCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := parse(tt.body)
			if err == nil {
				t.Fatalf("accepted: %+v", req)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			if e.Status != tt.status {
				t.Errorf("status = %d, want %d (%s)", e.Status, tt.status, e.Message)
			}
			if tt.param != "-" && e.Param != tt.param {
				t.Errorf("param = %q, want %q (%s)", e.Param, tt.param, e.Message)
			}
			if !strings.Contains(e.Message, tt.msg) {
				t.Errorf("message %q does not contain %q", e.Message, tt.msg)
			}
		})
	}
}

func parseCompletionString(p *parser) func(string) (*request, error) {
	return func(s string) (*request, error) { return p.parseCompletion(strings.NewReader(s)) }
}

func parseChatString(p *parser) func(string) (*request, error) {
	return func(s string) (*request, error) { return p.parseChat(strings.NewReader(s)) }
}

func TestParseCompletionRejects(t *testing.T) {
	long := `"` + strings.Repeat("x", testContextLen) + `"`
	longer := `"` + strings.Repeat("x", testContextLen+6) + `"`
	many := `[` + strings.Repeat(`"s",`, MaxStopStrings) + `"s"]`
	checkBad(t, parseCompletionString(testParser()), []badCase{
		{"not JSON", `not json`, 400, "", "invalid JSON"},
		{"empty body", ``, 400, "", "empty"},
		{"white space body", "  \n", 400, "", "empty"},
		{"truncated", `{"prompt":"hi"`, 400, "", "unexpected end"},
		{"array body", `[1,2]`, 400, "", "must be a JSON object"},
		{"string body", `"hi"`, 400, "", "must be a JSON object"},
		{"trailing garbage", `{"prompt":"hi"} x`, 400, "", "invalid JSON"},
		{"two objects", `{"prompt":"hi"}{}`, 400, "", "unexpected data"},
		{"max_tokens string", `{"prompt":"hi","max_tokens":"ten"}`, 400, "max_tokens", "max_tokens must be an integer"},
		{"max_tokens float", `{"prompt":"hi","max_tokens":1.5}`, 400, "max_tokens", "max_tokens must be an integer"},
		{"max_tokens huge", `{"prompt":"hi","max_tokens":1e30}`, 400, "max_tokens", "max_tokens must be an integer"},
		{"temperature string", `{"prompt":"hi","temperature":"hot"}`, 400, "temperature", "temperature must be a number"},
		{"stream string", `{"prompt":"hi","stream":"yes"}`, 400, "stream", "stream must be a boolean"},
		{"include_usage number", `{"prompt":"hi","stream":true,"stream_options":{"include_usage":1}}`, 400, "stream_options.include_usage", "boolean"},
		{"stream_options array", `{"prompt":"hi","stream_options":[]}`, 400, "stream_options", "object"},
		{"seed string", `{"prompt":"hi","seed":"x"}`, 400, "seed", "seed must be an integer"},
		{"seed float", `{"prompt":"hi","seed":1.5}`, 400, "seed", "seed must be an integer"},
		{"stop_token_ids string", `{"prompt":"hi","stop_token_ids":"a"}`, 400, "stop_token_ids", "array"},
		{"stop_token_ids negative", `{"prompt":"hi","stop_token_ids":[-1]}`, 400, "stop_token_ids", "not a token id"},
		{"stop_token_ids too big", `{"prompt":"hi","stop_token_ids":[3000000000]}`, 400, "stop_token_ids", "not a token id"},
		{"prompt missing", `{}`, 400, "prompt", "prompt is required"},
		{"prompt null", `{"prompt":null}`, 400, "prompt", "prompt is required"},
		{"prompt empty string", `{"prompt":""}`, 400, "prompt", "must not be empty"},
		{"prompt empty array", `{"prompt":[]}`, 400, "prompt", "must not be empty"},
		{"prompt empty id array", `{"prompt":[[]]}`, 400, "prompt", "must not be empty"},
		{"prompt one empty string", `{"prompt":[""]}`, 400, "prompt", "must not be empty"},
		{"two text prompts", `{"prompt":["a","b"]}`, 400, "prompt", "only one prompt"},
		{"two id prompts", `{"prompt":[[1],[2]]}`, 400, "prompt", "only one prompt"},
		{"mixed prompt", `{"prompt":[1,"a"]}`, 400, "prompt", "prompt must be a string"},
		{"mixed strings", `{"prompt":["a",1]}`, 400, "prompt", "prompt must be a string"},
		{"float id", `{"prompt":[1.5]}`, 400, "prompt", "prompt must be a string"},
		{"negative id", `{"prompt":[-1]}`, 400, "prompt", "not a token id"},
		{"id over int32", `{"prompt":[3000000000]}`, 400, "prompt", "not a token id"},
		{"nested id over int32", `{"prompt":[[1, 3000000000]]}`, 400, "prompt", "not a token id"},
		{"prompt number", `{"prompt":5}`, 400, "prompt", "prompt must be a string"},
		{"prompt object", `{"prompt":{"a":1}}`, 400, "prompt", "prompt must be a string"},
		{"prompt bool", `{"prompt":true}`, 400, "prompt", "prompt must be a string"},
		{"encode fails", `{"prompt":"FAIL-ENCODE"}`, 400, "prompt", "cannot tokenize"},
		{"unknown model", `{"model":"other","prompt":"hi"}`, 404, "model", "The model `other` does not exist"},
		{"model number", `{"model":1,"prompt":"hi"}`, 400, "model", "model must be a string"},
		{"n=0", `{"prompt":"hi","n":0}`, 400, "n", "n must be in [1, 128], got 0"},
		{"n=129", `{"prompt":"hi","n":129}`, 400, "n", "n must be in [1, 128], got 129"},
		{"logprobs -1", `{"prompt":"hi","logprobs":-1}`, 400, "logprobs", "logprobs must be in [0, 20], got -1"},
		{"logprobs 21", `{"prompt":"hi","logprobs":21}`, 400, "logprobs", "logprobs must be in [0, 20], got 21"},
		{"best_of below n", `{"prompt":"hi","n":3,"best_of":2}`, 400, "best_of", "best_of must be in [n = 3, 128], got 2"},
		{"best_of with stream", `{"prompt":"hi","best_of":2,"stream":true}`, 400, "best_of", "not allowed with stream"},
		{"suffix", `{"prompt":"hi","suffix":"x"}`, 400, "suffix", "not supported"},
		{"presence_penalty", `{"prompt":"hi","presence_penalty":2.5}`, 400, "presence_penalty", "presence_penalty must be in [-2, 2], got 2.5"},
		{"frequency_penalty", `{"prompt":"hi","frequency_penalty":-3}`, 400, "frequency_penalty", "frequency_penalty must be in [-2, 2], got -3"},
		{"logit_bias key", `{"prompt":"hi","logit_bias":{"a":2}}`, 400, "logit_bias", `logit_bias keys must be token ids, got "a"`},
		{"logit_bias negative key", `{"prompt":"hi","logit_bias":{"-1":2}}`, 400, "logit_bias", "logit_bias keys must be token ids"},
		{"logit_bias value", `{"prompt":"hi","logit_bias":{"1":101}}`, 400, "logit_bias", "logit_bias of token 1 must be in [-100, 100], got 101"},
		{"logit_bias twice", `{"prompt":"hi","logit_bias":{"1":1,"01":2}}`, 400, "logit_bias", "logit_bias names token 1 twice"},
		{"repetition_penalty 0", `{"prompt":"hi","repetition_penalty":0}`, 400, "repetition_penalty", "repetition_penalty must be a positive number, got 0"},
		{"min_p", `{"prompt":"hi","min_p":1.5}`, 400, "min_p", "min_p must be in [0, 1], got 1.5"},
		{"allowed_token_ids empty", `{"prompt":"hi","allowed_token_ids":[]}`, 400, "allowed_token_ids", "must not be empty"},
		{"allowed_token_ids negative", `{"prompt":"hi","allowed_token_ids":[-1]}`, 400, "allowed_token_ids", "-1 is not a token id"},
		{"bad_words empty", `{"prompt":"hi","bad_words":[" "]}`, 400, "bad_words", "bad_words[0] is empty"},
		{"prompt_logprobs with stream", `{"prompt":"hi","prompt_logprobs":1,"stream":true}`, 400, "prompt_logprobs", "not available with stream"},
		{"prompt_logprobs 21", `{"prompt":"hi","prompt_logprobs":21}`, 400, "prompt_logprobs", "prompt_logprobs must be in [0, 20], got 21"},
		{"logit_bias null", `{"prompt":"hi","logit_bias":{"1":null}}`, 400, "logit_bias", "got null"},
		{"stop null", `{"prompt":"hi","stop":["a",null]}`, 400, "stop", "stop[1] must be a string, got null"},
		{"bad_words null", `{"prompt":"hi","bad_words":[null]}`, 400, "bad_words", "bad_words[0] must be a string, got null"},
		{"truncate_prompt_tokens beyond the context", `{"prompt":"hi","truncate_prompt_tokens":65}`, 400, "truncate_prompt_tokens", "more than this model's context length (64)"},
		{"truncate_prompt_tokens 0", `{"prompt":"hi","truncate_prompt_tokens":0}`, 400, "truncate_prompt_tokens", "-1 or at least 1"},
		{"timeout 0", `{"prompt":"hi","timeout":0}`, 400, "timeout", "timeout must be a number of seconds in (0, 86400], got 0"},
		{"priority huge", `{"prompt":"hi","priority":3000000000}`, 400, "priority", "priority must be in"},
		{"beam search", `{"prompt":"hi","use_beam_search":true}`, 400, "use_beam_search", "not supported"},
		{"length_penalty", `{"prompt":"hi","length_penalty":2}`, 400, "length_penalty", "not supported"},
		{"kv_transfer_params", `{"prompt":"hi","kv_transfer_params":{"do_remote_decode":true}}`, 400, "kv_transfer_params", "not supported"},
		{"skip_special_tokens false", `{"prompt":"hi","skip_special_tokens":false}`, 400, "skip_special_tokens", "not supported"},
		{"prompt_embeds", `{"prompt":"hi","prompt_embeds":"AAAA"}`, 400, "prompt_embeds", "not supported"},
		{"max_tokens 0 and n 2", `{"prompt":"hi","max_tokens":0,"echo":true,"n":2}`, 400, "n", "max_tokens 0"},
		{"min_tokens negative", `{"prompt":"hi","min_tokens":-1}`, 400, "min_tokens", "min_tokens must be at least 0, got -1"},
		{"min_tokens over max_tokens", `{"prompt":"hi","max_tokens":4,"min_tokens":5}`, 400, "min_tokens", "min_tokens must be at most max_tokens (4), got 5"},
		{"min_tokens over the default max_tokens", `{"prompt":"hi","min_tokens":17}`, 400, "min_tokens", "at most max_tokens (16), got 17"},
		{"min_tokens string", `{"prompt":"hi","min_tokens":"5"}`, 400, "min_tokens", ""},
		{"max_tokens 0", `{"prompt":"hi","max_tokens":0}`, 400, "max_tokens", "max_tokens must be at least 1, got 0 (0, the prompt alone, only with echo)"},
		{"max_tokens negative", `{"prompt":"hi","max_tokens":-5}`, 400, "max_tokens", "at least 1"},
		{"prompt+max_tokens over context", `{"prompt":"hi","max_tokens":63}`, 400, "max_tokens",
			"This model's maximum context length is 64 tokens. However, you requested 65 tokens (2 in the prompt, 63 in the completion)."},
		{"max_tokens near MaxInt64", `{"prompt":"hi","max_tokens":9223372036854775807}`, 400, "max_tokens", "you requested 9223372036854775809 tokens"},
		{"prompt fills context", `{"prompt":` + long + `}`, 400, "prompt", "However, your request has 64 input tokens"},
		{"prompt over context", `{"prompt":` + longer + `,"max_tokens":1}`, 400, "prompt", "you requested 71 tokens (70 in the prompt, 1 in the completion)"},
		{"temperature negative", `{"prompt":"hi","temperature":-1}`, 400, "temperature", "temperature must be in [0, 100]"},
		{"temperature high", `{"prompt":"hi","temperature":101}`, 400, "temperature", "temperature must be in"},
		{"temperature overflows float32", `{"prompt":"hi","temperature":1e300}`, 400, "temperature", "temperature is out of range, got 1e+300"},
		{"top_p 0", `{"prompt":"hi","top_p":0}`, 400, "top_p", "top_p must be in (0, 1]"},
		{"top_p 1.5", `{"prompt":"hi","top_p":1.5}`, 400, "top_p", "top_p must be in"},
		{"top_p tiny", `{"prompt":"hi","top_p":1e-50}`, 400, "top_p", "top_p must be in"},
		{"top_k -2", `{"prompt":"hi","top_k":-2}`, 400, "top_k", "top_k must be"},
		{"top_k float", `{"prompt":"hi","top_k":2.5}`, 400, "top_k", "top_k must be an integer"},
		{"stop number", `{"prompt":"hi","stop":5}`, 400, "stop", "stop must be a string or an array of strings"},
		{"stop array of numbers", `{"prompt":"hi","stop":[1]}`, 400, "stop", "stop must be a string or an array"},
		{"too many stops", `{"prompt":"hi","stop":` + many + `}`, 400, "stop", "at most 16 stop strings"},
		{"stop too long", `{"prompt":"hi","stop":"` + strings.Repeat("s", MaxStopStringBytes+1) + `"}`, 400, "stop", "at most 1024 bytes"},
		{"too many stop_token_ids", `{"prompt":"hi","stop_token_ids":[` + strings.Repeat("1,", MaxStopTokenIDs) + `1]}`, 400, "stop_token_ids", "at most 1024"},
	})
}

// TestParseLogprobVolume: a request whose logprobs could exceed
// MaxLogprobEntries is refused before it runs, naming the field.
func TestParseLogprobVolume(t *testing.T) {
	p := testParser()
	p.contextLen = 1 << 20
	checkBad(t, parseCompletionString(p), []badCase{
		{"completions", `{"prompt":"hi","logprobs":20,"n":128,"max_tokens":10000}`, 400, "logprobs", "more than 4194304"},
	})
	checkBad(t, parseChatString(p), []badCase{
		{"chat, the rest of the context", `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":1,"n":8}`, 400, "top_logprobs", "lower max_tokens"},
	})
	if _, err := p.parseCompletion(strings.NewReader(`{"prompt":"hi","logprobs":20,"n":8,"max_tokens":10000}`)); err != nil {
		t.Fatalf("1.7M entries: %v", err)
	}
}

func TestParseNoTokenizer(t *testing.T) {
	checkBad(t, parseCompletionString(noTokParser()), []badCase{
		{"text prompt", `{"prompt":"hi"}`, 400, "prompt", "no tokenizer"},
		{"stop strings", `{"prompt":[1,2],"stop":"x"}`, 400, "stop", "no tokenizer"},
	})
	checkBad(t, parseChatString(noTokParser()), []badCase{
		{"chat", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "messages", "no tokenizer"},
	})
	req, err := noTokParser().parseCompletion(strings.NewReader(`{"prompt":[1,2,3],"stop":""}`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int32{1, 2, 3}, req.promptIDs); diff != "" {
		t.Error(diff)
	}
}

// TestParseVocabBound: with the vocabulary size known, an id outside it is
// the front end's 400 naming the prompt.
func TestParseVocabBound(t *testing.T) {
	p := noTokParser()
	p.vocabSize = 256
	checkBad(t, parseCompletionString(p), []badCase{
		{"id = vocab", `{"prompt":[1,256]}`, 400, "prompt", "prompt token id 256 (at 1) is outside the vocabulary (ids 0 to 255)"},
		{"nested", `{"prompt":[[300]]}`, 400, "prompt", "outside the vocabulary"},
	})
	if _, err := p.parseCompletion(strings.NewReader(`{"prompt":[0,255]}`)); err != nil {
		t.Errorf("ids within the vocabulary: %v", err)
	}
}

func TestParseChatRejects(t *testing.T) {
	checkBad(t, parseChatString(testParser()), []badCase{
		{"no messages", `{}`, 400, "messages", "messages must not be empty"},
		{"empty messages", `{"messages":[]}`, 400, "messages", "messages must not be empty"},
		{"messages string", `{"messages":"hi"}`, 400, "messages", "messages must be an array"},
		{"message not object", `{"messages":["hi"]}`, 400, "messages", "messages must be an object"},
		{"no role", `{"messages":[{"content":"x"}]}`, 400, "messages", "messages[0].role is required"},
		{"no content", `{"messages":[{"role":"user"}]}`, 400, "messages", "messages[0].content is required for role user"},
		{"null content", `{"messages":[{"role":"assistant","content":"a"},{"role":"system","content":null}]}`, 400, "messages",
			"messages[1].content is required for role system"},
		{"role number", `{"messages":[{"role":1,"content":"x"}]}`, 400, "messages.role", "must be a string"},
		{"content number", `{"messages":[{"role":"user","content":5}]}`, 400, "messages", "messages[0].content must be a string or an array of text parts"},
		{"content part not object", `{"messages":[{"role":"user","content":["x"]}]}`, 400, "messages", "messages[0].content must be"},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`, 400, "messages", `messages[0].content[1]: content type "image_url" is not supported`},
		{"template rejects", `{"messages":[{"role":"bad","content":"x"}]}`, 400, "messages", "chat template rejected"},
		{"encode fails", `{"messages":[{"role":"user","content":"FAIL-ENCODE"}]}`, 400, "messages", "cannot tokenize"},
		{"unknown model", `{"model":"x","messages":[{"role":"user","content":"hi"}]}`, 404, "model", "does not exist"},
		{"max_completion_tokens string", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":"x"}`, 400, "max_completion_tokens", "must be an integer"},
		{"max_completion_tokens 0", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, 400, "max_completion_tokens", "at least 1"},
		{"max_tokens 0", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, 400, "max_tokens", "at least 1"},
		{"min_tokens over the rest of the context", `{"messages":[{"role":"user","content":"hi"}],"min_tokens":64}`, 400, "min_tokens", "this model's context length leaves"},
		{"min_tokens over max_completion_tokens", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3,"min_tokens":4}`, 400, "min_tokens", "min_tokens must be at most max_completion_tokens (3), got 4"},
		{"context", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":60}`, 400, "max_tokens", "you requested 80 tokens (20 in the messages, 60 in the completion)"},
		{"top_logprobs without logprobs", `{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}`, 400, "top_logprobs", "top_logprobs needs logprobs: true"},
		{"top_logprobs 21", `{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs", "top_logprobs must be in [0, 20], got 21"},
		{"n", `{"messages":[{"role":"user","content":"hi"}],"n":0}`, 400, "n", "n must be in [1, 128], got 0"},
		{"best_of", `{"messages":[{"role":"user","content":"hi"}],"best_of":2}`, 400, "best_of", "not supported on chat"},
		{"tools", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f g"}}]}`, 400, "tools", "function.name must be"},
		{"response_format", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"structural_tag"}}`, 400, "response_format.type", "not supported"},
		{"structural_tag", `{"messages":[{"role":"user","content":"hi"}],"structural_tag":"{}"}`, 400, "structural_tag", "not supported"},
		{"audio", `{"messages":[{"role":"user","content":"hi"}],"audio":{"voice":"x"}}`, 400, "audio", "not supported"},
		{"modalities audio", `{"messages":[{"role":"user","content":"hi"}],"modalities":["text","audio"]}`, 400, "modalities", "only the text modality"},
		{"reasoning_effort", `{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"low"}`, 400, "reasoning_effort", "not supported"},
		{"both generation prompt and continue", `{"messages":[{"role":"assistant","content":"hi"}],"continue_final_message":true,"add_generation_prompt":true}`, 400, "continue_final_message", "cannot both be true"},
		{"untrusted chat_template", `{"messages":[{"role":"user","content":"hi"}],"chat_template":"{{ 1 }}"}`, 400, "chat_template", "--trust-request-chat-template"},
		{"temperature", `{"messages":[{"role":"user","content":"hi"}],"temperature":-0.5}`, 400, "temperature", "temperature must be in"},
		{"stop", `{"messages":[{"role":"user","content":"hi"}],"stop":{}}`, 400, "stop", "stop must be"},
	})
}

// TestParseTrustedChatTemplate: with --trust-request-chat-template a
// request's template renders the prompt; an empty one is refused.
func TestParseTrustedChatTemplate(t *testing.T) {
	p := chatParser()
	checkBad(t, parseChatString(p), []badCase{
		{"empty chat_template", `{"messages":[{"role":"user","content":"hi"}],"chat_template":""}`, 400, "chat_template", "must not be empty"},
	})
	req, err := p.parseChat(strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"chat_template":"T"}`))
	if err != nil || !strings.HasPrefix(string(toBytes(req.promptIDs)), "[T]<user>hi") {
		t.Fatalf("%+v %v", req, err)
	}
}

// cmpRequest compares requests field by field; whether max_tokens was
// defaulted is TestCompletionMaxTokensDefault's to check.
var cmpRequest = cmp.Options{cmp.AllowUnexported(request{}, toolRequest{}), cmpopts.IgnoreFields(request{}, "maxTokensDefault")}

// defaultCompletion is the request a completion of the prompt "hi" parses
// to with every default (the test parser's seed, 42), changed by mod.
func defaultCompletion(mod func(*request)) *request {
	r := &request{promptIDs: []int32{'h', 'i'}, maxTokens: DefaultCompletionMaxTokens, n: 1, bestOf: 1,
		sampling: model.SamplingParams{Temperature: 1, TopP: 1, Seed: 42}}
	if mod != nil {
		mod(r)
	}
	return r
}

func TestParseCompletionAccepts(t *testing.T) {
	def := defaultCompletion
	tests := []struct {
		name string
		body string
		want *request
	}{
		{"defaults", `{"prompt":"hi"}`, def(nil)},
		{"served model, unknown fields", `{"model":"m","prompt":"hi","user":"u","foo":{"bar":[1]},"echo":false,"n":1,"best_of":1,"presence_penalty":0,"logit_bias":{}}`, def(nil)},
		{"nulls", `{"prompt":"hi","max_tokens":null,"temperature":null,"stop":null,"logprobs":null,"seed":null}`, def(nil)},
		{"array of one string", `{"prompt":["hi"]}`, def(nil)},
		{"token ids", `{"prompt":[104,105]}`, def(nil)},
		{"one array of token ids", `{"prompt":[[104,105]]}`, def(nil)},
		{"sampling", `{"prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":7,"seed":-1}`, def(func(r *request) {
			r.maxTokens = 5
			r.sampling = model.SamplingParams{Temperature: 0, TopP: 0.5, TopK: 7, Seed: math.MaxUint64}
		})},
		{"top_k -1 is off", `{"prompt":"hi","top_k":-1}`, def(nil)},
		{"max_tokens fills context", `{"prompt":"hi","max_tokens":62}`, def(func(r *request) { r.maxTokens = 62 })},
		{"stop string", `{"prompt":"hi","stop":"\n"}`, def(func(r *request) { r.stop = []string{"\n"} })},
		{"stop array, empty dropped", `{"prompt":"hi","stop":["a","","bc"]}`, def(func(r *request) { r.stop = []string{"a", "bc"} })},
		{"stop only empty", `{"prompt":"hi","stop":[""]}`, def(nil)},
		{"extensions", `{"prompt":"hi","stop_token_ids":[7,0],"ignore_eos":true,"include_stop_str_in_output":true,"return_token_ids":true}`, def(func(r *request) {
			r.stopTokenIDs = []int32{7, 0}
			r.ignoreEOS, r.includeStopStr, r.returnTokenIDs = true, true, true
		})},
		{"min_tokens", `{"prompt":"hi","max_tokens":5,"min_tokens":5}`, def(func(r *request) { r.maxTokens, r.minTokens = 5, 5 })},
		{"min_tokens 0", `{"prompt":"hi","min_tokens":0}`, def(nil)},
		{"stream with usage", `{"prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, def(func(r *request) { r.stream, r.includeUsage = true, true })},
		// vLLM lets a falsy stream_options through without stream.
		{"stream_options null", `{"prompt":"hi","stream_options":null}`, def(nil)},
		{"stream_options empty", `{"prompt":"hi","stream":false,"stream_options":{}}`, def(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := testParser().parseCompletion(strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpRequest); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseChatAccepts(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		prompt    string
		maxTokens int
	}{
		{"string content", `{"model":"m","messages":[{"role":"system","content":"be"},{"role":"user","content":"hi"}]}`,
			"<system>be\n<user>hi\n<assistant>", testContextLen - 31},
		{"parts joined", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			"<user>a\nb\n<assistant>", testContextLen - 21},
		{"null content", `{"messages":[{"role":"assistant","content":null},{"role":"user","content":"x"}]}`,
			"<assistant>\n<user>x\n<assistant>", testContextLen - 31},
		{"max_completion_tokens wins", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_completion_tokens":3}`,
			"<user>x\n<assistant>", 3},
		{"max_tokens", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`, "<user>x\n<assistant>", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := testParser().parseChat(strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			ids, _ := byteTokenizer{}.Encode(tt.prompt, false)
			want := &request{chat: true, promptIDs: ids, maxTokens: tt.maxTokens, n: 1, bestOf: 1,
				sampling: model.SamplingParams{Temperature: 1, TopP: 1, Seed: 42}}
			if diff := cmp.Diff(want, got, cmpRequest); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestCompletionMaxTokensDefault: without max_tokens a completion gets 16
// tokens (the OpenAI default), or the rest of the context if less; a chat
// request gets the rest of the context. Either is marked as a default (the
// router cuts it to what the chosen workers' context leaves); a max_tokens
// the client sent is not.
func TestCompletionMaxTokensDefault(t *testing.T) {
	p := testParser()
	for _, tc := range []struct {
		prompt int
		want   int
	}{{2, DefaultCompletionMaxTokens}, {testContextLen - 5, 5}} {
		req, err := p.parseCompletion(strings.NewReader(`{"prompt":"` + strings.Repeat("x", tc.prompt) + `"}`))
		if err != nil || req.maxTokens != tc.want || !req.maxTokensDefault {
			t.Fatalf("prompt of %d tokens: max_tokens %v, want %d, a default (%v)", tc.prompt, req, tc.want, err)
		}
	}
	req, err := p.parseChat(strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil || req.maxTokens != testContextLen-len(req.promptIDs) || !req.maxTokensDefault {
		t.Fatalf("chat max_tokens %+v %v", req, err)
	}
	for _, body := range []string{`{"prompt":"hi","max_tokens":16}`, `{"prompt":"hi","max_tokens":3}`} {
		if req, err := p.parseCompletion(strings.NewReader(body)); err != nil || req.maxTokensDefault {
			t.Fatalf("%s: %+v %v, want max_tokens the client's", body, req, err)
		}
	}
	if req, err := p.parseChat(strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`)); err != nil ||
		req.maxTokensDefault {
		t.Fatalf("chat with max_completion_tokens: %+v %v", req, err)
	}
}

// TestParseWholeNumberFloats: an integer field takes a float that is a
// whole number (3.0, 1e1), as Python clients send and vLLM's pydantic
// models accept; a fractional part, a number beyond int64 or another type
// is a 400 naming the field.
func TestParseWholeNumberFloats(t *testing.T) {
	def := defaultCompletion
	for _, tt := range []struct {
		name string
		body string
		want *request
	}{
		{"max_tokens", `{"prompt":"hi","max_tokens":3.0}`, def(func(r *request) { r.maxTokens = 3 })},
		{"exponent", `{"prompt":"hi","max_tokens":1e1}`, def(func(r *request) { r.maxTokens = 10 })},
		{"n and best_of", `{"prompt":"hi","n":1.0,"best_of":1.0}`, def(nil)},
		{"min_tokens", `{"prompt":"hi","max_tokens":4,"min_tokens":2.0}`, def(func(r *request) { r.maxTokens, r.minTokens = 4, 2 })},
		{"seed", `{"prompt":"hi","seed":5.0}`, def(func(r *request) { r.sampling.Seed = 5 })},
		{"negative seed", `{"prompt":"hi","seed":-1.0}`, def(func(r *request) { r.sampling.Seed = math.MaxUint64 })},
		{"top_k", `{"prompt":"hi","top_k":40.0}`, def(func(r *request) { r.sampling.TopK = 40 })},
		{"top_k -1", `{"prompt":"hi","top_k":-1.0}`, def(nil)},
		{"stop_token_ids", `{"prompt":"hi","stop_token_ids":[7.0,0.0,2e0]}`, def(func(r *request) { r.stopTokenIDs = []int32{7, 0, 2} })},
		{"prompt token ids", `{"prompt":[104.0,1.05e2]}`, def(nil)},
		{"nested prompt token ids", `{"prompt":[[104,105.0]]}`, def(nil)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := testParser().parseCompletion(strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmpRequest); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	chat := func(extra string) string {
		return `{"messages":[{"role":"user","content":"x"}],` + extra + `}`
	}
	req, err := testParser().parseChat(strings.NewReader(chat(`"max_completion_tokens":3.0,"top_logprobs":0.0`)))
	if err != nil || req.maxTokens != 3 {
		t.Fatalf("chat: %+v, %v", req, err)
	}
	checkBad(t, parseCompletionString(testParser()), []badCase{
		// A whole number reaches the field's own check.
		{"logprobs 21.0", `{"prompt":"hi","logprobs":21.0}`, 400, "logprobs", "logprobs must be in [0, 20], got 21"},
		{"n 0.0", `{"prompt":"hi","n":0.0}`, 400, "n", "n must be in [1, 128], got 0"},
		{"max_tokens 0.0", `{"prompt":"hi","max_tokens":0.0}`, 400, "max_tokens", "max_tokens must be at least 1, got 0"},
		{"max_tokens 3.5", `{"prompt":"hi","max_tokens":3.5}`, 400, "max_tokens", "max_tokens must be an integer, got 3.5 (a number with a fractional part)"},
		{"n 1.5", `{"prompt":"hi","n":1.5}`, 400, "n", "n must be an integer, got 1.5 (a number with a fractional part)"},
		{"min_tokens -0.5", `{"prompt":"hi","min_tokens":-0.5}`, 400, "min_tokens", "fractional part"},
		{"seed 1e19", `{"prompt":"hi","seed":1e19}`, 400, "seed", "seed must be an integer, got 1e19 (out of range: at most 9223372036854775807)"},
		{"seed 2^63", `{"prompt":"hi","seed":9223372036854775808}`, 400, "seed", "seed must be an integer, got 9223372036854775808 (out of range: at most 9223372036854775807)"},
		{"top_k 1e400", `{"prompt":"hi","top_k":1e400}`, 400, "top_k", "top_k must be an integer, got 1e400 (out of range"},
		{"max_tokens -1e30", `{"prompt":"hi","max_tokens":-1e30}`, 400, "max_tokens", "max_tokens must be an integer, got -1e30 (out of range: at least -9223372036854775808)"},
		{"best_of 1.000001", `{"prompt":"hi","best_of":1.000001}`, 400, "best_of", "fractional part"},
		{"stop_token_ids 1.5", `{"prompt":"hi","stop_token_ids":[1,1.5]}`, 400, "stop_token_ids", "stop_token_ids must be an integer, got 1.5"},
		{"max_tokens string", `{"prompt":"hi","max_tokens":"3"}`, 400, "max_tokens", "max_tokens must be an integer, got string"},
		{"max_tokens bool", `{"prompt":"hi","max_tokens":true}`, 400, "max_tokens", "max_tokens must be an integer, got bool"},
		{"top_k object", `{"prompt":"hi","top_k":{}}`, 400, "top_k", "top_k must be an integer, got object"},
		{"stop_token_ids strings", `{"prompt":"hi","stop_token_ids":["1"]}`, 400, "stop_token_ids", "must be an integer, got string"},
		{"prompt 104.5", `{"prompt":[104.5]}`, 400, "prompt", "prompt must be a string"},
	})
	checkBad(t, parseChatString(testParser()), []badCase{
		{"max_completion_tokens 2.5", chat(`"max_completion_tokens":2.5`), 400, "max_completion_tokens", "fractional part"},
		{"top_logprobs 2.0", chat(`"top_logprobs":2.0`), 400, "top_logprobs", "top_logprobs needs logprobs: true"},
	})
}

// TestParseFloatRange: a float field beyond float32 (the sampler's
// precision) or float64 is refused with the value the client sent, never
// the +Inf or 0 it would have become.
func TestParseFloatRange(t *testing.T) {
	cases := []badCase{
		{"temperature 1e39", `{"prompt":"hi","temperature":1e39}`, 400, "temperature", "temperature is out of range, got 1e+39 (beyond float32, the sampler's precision)"},
		{"temperature -1e39", `{"prompt":"hi","temperature":-1e39}`, 400, "temperature", "temperature is out of range, got -1e+39"},
		{"top_p 1e39", `{"prompt":"hi","top_p":1e39}`, 400, "top_p", "top_p is out of range, got 1e+39"},
		{"top_p 1e-50", `{"prompt":"hi","top_p":1e-50}`, 400, "top_p", "top_p must be in (0, 1], got 1e-50, which is 0 in float32 (the sampler's precision)"},
		{"temperature 1e400", `{"prompt":"hi","temperature":1e400}`, 400, "temperature", "temperature must be a finite number, got 1e400 (out of range)"},
		{"top_p -1e400", `{"prompt":"hi","top_p":-1e400}`, 400, "top_p", "got -1e400 (out of range)"},
		{"presence_penalty 1e400", `{"prompt":"hi","presence_penalty":1e400}`, 400, "presence_penalty", "out of range"},
		{"logit_bias 1e400", `{"prompt":"hi","logit_bias":{"1":1e400}}`, 400, "logit_bias", "out of range"},
	}
	checkBad(t, parseCompletionString(testParser()), cases)
	for _, c := range cases {
		_, err := testParser().parseCompletion(strings.NewReader(c.body))
		if err != nil && (strings.Contains(err.Error(), "Inf") || strings.Contains(err.Error(), "got 0")) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// A temperature too small for float32 is greedy, as vLLM treats any
	// temperature below 1e-5.
	req, err := testParser().parseCompletion(strings.NewReader(`{"prompt":"hi","temperature":1e-50}`))
	if err != nil || req.sampling.Temperature != 0 {
		t.Fatalf("temperature 1e-50: %+v, %v", req, err)
	}
}

// TestParseStreamOptionsNeedStream: stream_options other than null or {}
// without "stream": true is a 400 naming it, as vLLM answers ("Stream
// options can only be defined when `stream=True`.").
func TestParseStreamOptionsNeedStream(t *testing.T) {
	const msg = "stream_options is only allowed when stream is true"
	checkBad(t, parseCompletionString(testParser()), []badCase{
		{"no stream", `{"prompt":"hi","stream_options":{"include_usage":true}}`, 400, "stream_options", msg},
		{"stream false", `{"prompt":"hi","stream":false,"stream_options":{"include_usage":false}}`, 400, "stream_options", msg},
		{"stream null", `{"prompt":"hi","stream":null,"stream_options":{"include_usage":true}}`, 400, "stream_options", msg},
		{"unknown option", `{"prompt":"hi","stream_options":{"continuous_usage_stats":true}}`, 400, "stream_options", msg},
	})
	checkBad(t, parseChatString(testParser()), []badCase{
		{"chat", `{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, 400, "stream_options", msg},
	})
}
