package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fieldCase is one request field of OpenAI's or vLLM's schema with a
// value other than its default. base, if set, replaces the rest of the
// body (e.g. a stream for stream_options).
type fieldCase struct {
	name, value, base string
}

// Every field of OpenAI's completions and chat completions request schemas
// and of vLLM's extensions to them (vllm/entrypoints/openai/protocol.py:
// CompletionRequest and ChatCompletionRequest), with a value that is not
// the default.
var (
	commonFields = []fieldCase{
		{"model", `"other"`, ""}, {"frequency_penalty", `0.5`, ""}, {"presence_penalty", `0.5`, ""},
		{"logit_bias", `{"104":5}`, ""}, {"max_tokens", `3`, ""}, {"n", `2`, ""}, {"seed", `7`, ""},
		{"stop", `"x"`, ""}, {"stream", `true`, ""}, {"stream_options", `{"include_usage":true}`, `"stream":true`},
		{"temperature", `0.5`, ""}, {"top_p", `0.5`, ""}, {"user", `"u"`, ""}, {"response_format", `{"type":"json_object"}`, ""},
		{"metadata", `{"a":"b"}`, ""}, {"store", `true`, ""}, {"service_tier", `"auto"`, ""},
		{"prompt_cache_key", `"k"`, ""}, {"safety_identifier", `"s"`, ""},
		// vLLM's sampling extensions.
		{"use_beam_search", `true`, ""}, {"top_k", `5`, ""}, {"min_p", `0.1`, ""}, {"repetition_penalty", `1.2`, ""},
		{"length_penalty", `2`, ""}, {"stop_token_ids", `[5]`, ""}, {"include_stop_str_in_output", `true`, ""},
		{"ignore_eos", `true`, ""}, {"min_tokens", `1`, ""}, {"skip_special_tokens", `false`, ""},
		{"spaces_between_special_tokens", `false`, ""}, {"truncate_prompt_tokens", `1`, ""},
		{"allowed_token_ids", `[104,105]`, ""}, {"prompt_logprobs", `1`, ""}, {"bad_words", `["x"]`, ""},
		{"add_special_tokens", `true`, ""}, {"return_tokens_as_token_ids", `true`, `"logprobs":` + "LOGPROBS"},
		{"return_token_ids", `true`, ""}, {"priority", `1`, ""}, {"request_id", `"r"`, ""}, {"cache_salt", `"s"`, ""},
		{"logits_processors", `["x"]`, ""}, {"kv_transfer_params", `{}`, ""}, {"vllm_xargs", `{"a":1}`, ""},
		{"structured_outputs", `{"choice":["a","b"]}`, ""}, {"guided_json", `{"type":"string"}`, ""}, {"guided_regex", `"a"`, ""},
		{"guided_choice", `["a"]`, ""}, {"guided_grammar", `"root ::= \"a\""`, ""}, {"structural_tag", `"t"`, ""},
		{"guided_decoding_backend", `"xgrammar"`, ""}, {"guided_whitespace_pattern", `" "`, ""},
		// llama.cpp server's constraint fields.
		{"json_schema", `{"type":"string"}`, ""}, {"grammar", `"root ::= \"a\""`, ""},
		{"timeout", `5`, ""},
	}
	completionFields = []fieldCase{
		{"best_of", `2`, ""}, {"echo", `true`, ""}, {"logprobs", `1`, ""}, {"suffix", `"s"`, ""},
		{"prompt_embeds", `"AAAA"`, ""},
	}
	chatFields = []fieldCase{
		{"logprobs", `true`, ""}, {"top_logprobs", `2`, `"logprobs":true`}, {"max_completion_tokens", `3`, ""},
		{"tools", `[{"type":"function","function":{"name":"f"}}]`, ""},
		{"tool_choice", `"required"`, `"tools":[{"type":"function","function":{"name":"f"}}]`},
		{"functions", `[{"name":"f"}]`, ""}, {"function_call", `"auto"`, ""},
		{"parallel_tool_calls", `false`, `"tools":[{"type":"function","function":{"name":"f"}}]`},
		{"audio", `{"voice":"v","format":"mp3"}`, ""}, {"modalities", `["audio"]`, ""}, {"prediction", `{"type":"content"}`, ""},
		{"web_search_options", `{}`, ""}, {"verbosity", `"low"`, ""}, {"reasoning_effort", `"low"`, ""},
		{"include_reasoning", `false`, ""}, {"documents", `[{"text":"d"}]`, ""}, {"mm_processor_kwargs", `{}`, ""},
		{"echo", `true`, ""}, {"best_of", `2`, ""}, {"chat_template", `"{{ messages }}"`, ""},
		{"chat_template_kwargs", `{"enable_thinking":false}`, ""}, {"add_generation_prompt", `false`, ""},
		{"continue_final_message", `true`, `"add_generation_prompt":false`},
	}
	// noEffect are the fields accepted without changing the answer, and
	// why.
	noEffect = map[string]string{
		"user": "OpenAI's end-user id", "metadata": "stored completions' tags", "store": "nothing is stored",
		"service_tier": "one tier", "prompt_cache_key": "the prefix cache needs no key",
		"safety_identifier": "an end-user id", "request_id": "pdserve mints its own ids",
		"cache_salt":                    "each worker's prefix cache is its own",
		"spaces_between_special_tokens": "special tokens are never rendered",
		"guided_decoding_backend":       "pdserve has one grammar engine",
		"guided_whitespace_pattern":     "tunes a JSON constraint, and there is none",
		// The test parser's byte tokenizer has no BOS: the field is
		// honoured (add_special_tokens reaches Encode) but changes nothing
		// here.
		"add_special_tokens": "the test tokenizer adds nothing",
	}
)

// TestEveryFieldHonouredOrRefused walks every field of OpenAI's and vLLM's
// request schemas: sent with a value other than its default, each is
// refused naming it (400 or, for model, 404), or changes the validated
// request, or is listed in noEffect with the reason it changes nothing.
func TestEveryFieldHonouredOrRefused(t *testing.T) {
	// The chat's last message is the assistant's, so that echo and
	// continue_final_message have something to act on.
	const chatMsgs = `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]`
	endpoints := []struct {
		name   string
		parse  func(string) (*request, error)
		head   string
		fields []fieldCase
	}{
		{"completions", parseCompletionString(testParser()), `"prompt":"hi"`, append(commonFields, completionFields...)},
		{"chat", parseChatString(chatParser()), chatMsgs, append(commonFields, chatFields...)},
	}
	for _, ep := range endpoints {
		for _, f := range ep.fields {
			t.Run(ep.name+"/"+f.name, func(t *testing.T) {
				base := "{" + ep.head
				if f.base != "" {
					logprobs := "1"
					if ep.name == "chat" {
						logprobs = "true"
					}
					base += "," + strings.ReplaceAll(f.base, "LOGPROBS", logprobs)
				}
				want, err := ep.parse(base + "}")
				if err != nil {
					t.Fatalf("the base request %s}: %v", base, err)
				}
				got, err := ep.parse(base + `,"` + f.name + `":` + f.value + "}")
				var e *Error
				switch {
				case errors.As(err, &e):
					if e.Param != f.name || (e.Status != 400 && !(f.name == "model" && e.Status == 404)) {
						t.Errorf("refused with %d, param %q: %s", e.Status, e.Param, e.Message)
					}
					if _, ok := noEffect[f.name]; ok {
						t.Errorf("listed as accepted without effect, but refused: %s", e.Message)
					}
				case err != nil:
					t.Fatal(err)
				case cmp.Equal(want, got, cmpRequest):
					if _, ok := noEffect[f.name]; !ok {
						t.Errorf("accepted and ignored: %s changes nothing in the request", f.value)
					}
				default:
					if why, ok := noEffect[f.name]; ok {
						t.Errorf("listed as without effect (%s), but it changed the request: %s", why, cmp.Diff(want, got, cmpRequest))
					}
				}
			})
		}
	}
}

// chatParser is the test parser whose chat template honours
// add_generation_prompt, continue_final_message, a request's template and
// its kwargs (the byte tokenizer's ignores them), and which trusts a
// request's template (--trust-request-chat-template).
func chatParser() *parser {
	p := testParser()
	p.tok = optionsTokenizer{}
	p.trustTemplate = true
	return p
}
