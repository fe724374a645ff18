package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pdserve/pdserve/internal/model"
)

func TestChatOptions(t *testing.T) {
	t.Parallel()
	tok := loadTiny(t, nil) // "{{ bos_token }}{% for m %}[role]content{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
	user := model.Message{Role: "user", Content: "hi"}
	kw := func(pairs ...string) map[string]json.RawMessage {
		m := map[string]json.RawMessage{}
		for i := 0; i < len(pairs); i += 2 {
			m[pairs[i]] = json.RawMessage(pairs[i+1])
		}
		return m
	}
	for _, c := range []struct {
		name    string
		msgs    []model.Message
		opts    model.ChatOptions
		want    string
		wantErr string
	}{
		{name: "default", msgs: []model.Message{user}, want: "<s>[user]hi</s>[assistant]"},
		{name: "no generation prompt", msgs: []model.Message{user}, opts: model.ChatOptions{NoGenerationPrompt: true}, want: "<s>[user]hi</s>"},
		{name: "continue final message", msgs: []model.Message{user, {Role: "assistant", Content: "Hel"}},
			opts: model.ChatOptions{ContinueFinalMessage: true}, want: "<s>[user]hi</s>[assistant]Hel"},
		{name: "continue a message whose content repeats earlier", msgs: []model.Message{{Role: "user", Content: "ab"}, {Role: "assistant", Content: "ab"}},
			opts: model.ChatOptions{ContinueFinalMessage: true}, want: "<s>[user]ab</s>[assistant]ab"},
		{name: "continue keeps trailing space the template keeps", msgs: []model.Message{user, {Role: "assistant", Content: "Hel "}},
			opts: model.ChatOptions{ContinueFinalMessage: true}, want: "<s>[user]hi</s>[assistant]Hel "},
		{name: "continue cuts after the trimmed content when the template trims",
			msgs: []model.Message{user, {Role: "assistant", Content: " Hel \n"}},
			opts: model.ChatOptions{ContinueFinalMessage: true, Template: "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}<end>{% endfor %}"},
			want: "<user>hi<end><assistant>Hel"},
		{name: "continue needs an assistant message", msgs: []model.Message{user}, opts: model.ChatOptions{ContinueFinalMessage: true},
			wantErr: "continue_final_message needs a final message from the assistant"},
		{name: "continue needs the content in the output", msgs: []model.Message{user, {Role: "assistant", Content: "xyz"}},
			opts:    model.ChatOptions{ContinueFinalMessage: true, Template: "{% for m in messages %}[{{ m.role }}]{% endfor %}"},
			wantErr: "the final message does not appear"},
		{name: "request template", msgs: []model.Message{user},
			opts: model.ChatOptions{Template: "{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ add_generation_prompt }}"},
			want: "<s>user=hi;True"},
		{name: "request template that does not compile", msgs: []model.Message{user}, opts: model.ChatOptions{Template: "{% if %}"},
			wantErr: "the request's chat_template cannot be compiled"},
		{name: "request template too large", msgs: []model.Message{user}, opts: model.ChatOptions{Template: strings.Repeat("x", MaxTemplateBytes+1)},
			wantErr: "the request's chat_template has 65537 bytes, more than the 65536 allowed"},
		{name: "kwargs of every JSON type", msgs: []model.Message{user}, opts: model.ChatOptions{
			Template: "{{ o.b }} {{ o | tojson }} {{ a[1] }} {{ n + 1 }} {{ f * 2 }} {{ big is float }} {{ n is integer }} {{ s }} {{ t }} {{ z is none }} {{ a | length }}",
			Kwargs:   kw("o", `{"z": 1, "b": [true, null]}`, "a", `[1, "two", 3.5]`, "n", "41", "f", "1.25", "big", "1e3", "s", `"str"`, "t", "false", "z", "null")},
			want: `[True, None] {"z": 1, "b": [true, null]} two 42 2.5 True True str False True 3`},
		{name: "kwargs reach the model's template too", msgs: []model.Message{user},
			opts: model.ChatOptions{Kwargs: kw("unused", `"x"`)}, want: "<s>[user]hi</s>[assistant]"},
		{name: "kwarg messages", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("messages", "[]")}, wantErr: `"messages" may not be set`},
		{name: "kwarg add_generation_prompt", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("add_generation_prompt", "false")}, wantErr: `"add_generation_prompt" may not be set`},
		{name: "kwarg tools", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("tools", "[]")}, wantErr: `"tools" may not be set`},
		{name: "kwarg documents", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("documents", "[]")}, wantErr: `"documents" may not be set`},
		{name: "kwarg special token", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("bos_token", `"<x>"`)}, wantErr: `"bos_token" may not be set`},
		{name: "kwarg special token not set by the model", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("mask_token", `"<x>"`)}, wantErr: `"mask_token" may not be set`},
		{name: "kwarg invalid JSON", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("x", "{")}, wantErr: `chat_template_kwargs: "x": invalid JSON`},
		{name: "kwarg two values", msgs: []model.Message{user}, opts: model.ChatOptions{Kwargs: kw("x", "1 2")}, wantErr: "more than one value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(c.msgs, c.opts)
			switch {
			case c.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, c.wantErr)
				}
			case err != nil || got != c.want:
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// TestChatEnableThinking renders Qwen3's own template with
// chat_template_kwargs enable_thinking, which it reads.
func TestChatEnableThinking(t *testing.T) {
	t.Parallel()
	tok := loadShared(t, "qwen3")
	msgs := []model.Message{{Role: "user", Content: "hi"}}
	on, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	off, err := tok.ApplyChatTemplate(msgs, model.ChatOptions{Kwargs: map[string]json.RawMessage{"enable_thinking": json.RawMessage("false")}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"; on != want || off != want+"<think>\n\n</think>\n\n" {
		t.Fatalf("default %q, enable_thinking false %q", on, off)
	}
	// The continued prompt ends with the final message, without Qwen3's
	// <|im_end|>.
	cont, err := tok.ApplyChatTemplate(append(msgs, model.Message{Role: "assistant", Content: "Sure, "}), model.ChatOptions{ContinueFinalMessage: true})
	if err != nil || !strings.HasSuffix(cont, "<|im_start|>assistant\n<think>\n\n</think>\n\nSure, ") {
		t.Fatalf("continued: %q, %v", cont, err)
	}
}

func TestTemplateCache(t *testing.T) {
	t.Parallel()
	var c TemplateCache
	src := func(i int) string { return fmt.Sprintf("t%d{{ x }}", i) }
	first, err := c.Get(src(0))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Get(src(0)); again != first {
		t.Fatal("the same template compiled twice")
	}
	for i := 1; i < cachedTemplates; i++ {
		if _, err := c.Get(src(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Using template 0 again makes template 1 the least recently used,
	// which a new template then evicts.
	if again, _ := c.Get(src(0)); again != first {
		t.Fatal("template 0 evicted early")
	}
	if _, err := c.Get(src(cachedTemplates)); err != nil {
		t.Fatal(err)
	}
	var cached []string
	for _, e := range c.entries {
		cached = append(cached, strings.TrimSuffix(e.src, "{{ x }}"))
	}
	if got, want := strings.Join(cached, " "), "t2 t3 t4 t5 t6 t7 t0 t8"; got != want {
		t.Fatalf("cached %s, want %s", got, want)
	}
	if _, err := c.Get("{% for %}"); err == nil {
		t.Fatal("a template that does not compile was accepted")
	}
	if len(c.entries) != cachedTemplates {
		t.Fatal("a failed template was cached")
	}
}
