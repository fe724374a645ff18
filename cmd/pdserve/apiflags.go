package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/openai"
)

// apiFlags are the OpenAI API's options of a front end (router, serve,
// up), with vLLM's flag names.
type apiFlags struct {
	maxLogprobs     int
	logprobsMode    string
	trustTemplate   bool
	toolCallParser  string
	reasoningParser string
	anyOrder        bool
}

func (f *apiFlags) add(fs *pflag.FlagSet) {
	fs.IntVar(&f.maxLogprobs, "max-logprobs", openai.DefaultMaxLogprobs,
		"the most alternatives a request's logprobs, top_logprobs or prompt_logprobs may ask for, 1 to 1024 (vLLM's --max-logprobs)")
	fs.StringVar(&f.logprobsMode, "logprobs-mode", model.LogprobsRaw.String(),
		"the distribution logprobs are of: raw_logprobs (the model's, before penalties, bias, temperature and truncation) or processed_logprobs (the one tokens are drawn from), as vLLM's --logprobs-mode")
	fs.BoolVar(&f.trustTemplate, "trust-request-chat-template", false,
		"accept a chat request's chat_template (vLLM's flag): a template is a program the server runs with no bound on its time or memory, so only for trusted clients")
	fs.StringVar(&f.toolCallParser, "tool-call-parser", "auto",
		"how tool_choice auto finds calls in the model's text (vLLM's flag): "+strings.Join(openai.ToolCallParsers, ", ")+
			", none (the text is content) or auto (chosen from the chat template)")
	fs.StringVar(&f.reasoningParser, "reasoning-parser", "",
		"split a reasoning model's <think> block into reasoning_content (vLLM's flag): "+strings.Join(openai.ReasoningParsers, ", ")+
			"; none or empty leaves it in the content")
	fs.BoolVar(&f.anyOrder, "json-any-property-order", false,
		"let the members of JSON objects a request's JSON Schema constrains come in any order (default: the schema's order, as OpenAI's strict mode writes them); a key may then repeat, so it suits checking client-written JSON more than generating it")
}

// options validates the flags.
func (f *apiFlags) options() (openai.APIOptions, error) {
	if f.maxLogprobs < 1 || f.maxLogprobs > model.MaxLogprobs {
		return openai.APIOptions{}, usagef("--max-logprobs must be in [1, %d], got %d", model.MaxLogprobs, f.maxLogprobs)
	}
	mode, err := model.ParseLogprobsMode(f.logprobsMode)
	if err != nil {
		return openai.APIOptions{}, usagef("--logprobs-mode: %v", err)
	}
	o := openai.APIOptions{MaxLogprobs: f.maxLogprobs, LogprobsMode: mode, TrustRequestChatTemplate: f.trustTemplate,
		ToolCallParser: f.toolCallParser, ReasoningParser: f.reasoningParser, AnyPropertyOrder: f.anyOrder}
	if err := o.CheckParsers(); err != nil {
		return openai.APIOptions{}, usagef("%v", err)
	}
	return o, nil
}
