package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

func TestEncode(t *testing.T) {
	tok := byteTokenizer{}
	for _, tc := range []struct {
		text string
		want []int32
	}{
		{"", []int32{}},
		{"hi", []int32{'h', 'i'}},
		{"é€", []int32{0xc3, 0xa9, 0xe2, 0x82, 0xac}},
	} {
		got, err := tok.Encode(tc.text, true)
		if err != nil {
			t.Fatalf("Encode(%q): %v", tc.text, err)
		}
		if got == nil {
			t.Errorf("Encode(%q) = nil, want a non-nil slice", tc.text)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Encode(%q) (-want +got):\n%s", tc.text, diff)
		}
	}
}

func TestApplyChatTemplate(t *testing.T) {
	tok := byteTokenizer{}
	for _, tc := range []struct {
		name    string
		msgs    []model.Message
		want    string
		wantErr string
	}{
		{
			name: "system and user",
			msgs: []model.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
			want: "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n",
		},
		{
			name: "multi turn with developer",
			msgs: []model.Message{{Role: "developer", Content: "d"}, {Role: "user", Content: "q"},
				{Role: "assistant", Content: "a"}, {Role: "user", Content: ""}},
			want: "<|developer|>\nd\n<|user|>\nq\n<|assistant|>\na\n<|user|>\n\n<|assistant|>\n",
		},
		{name: "unknown role", msgs: []model.Message{{Role: "user", Content: "x"}, {Role: "robot", Content: "y"}},
			wantErr: `message 1 has unknown role "robot"`},
		{name: "no messages", wantErr: "no messages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(tc.msgs, model.ChatOptions{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecoder(t *testing.T) {
	const ff = "\uFFFD"
	for _, tc := range []struct {
		name  string
		ids   []int32
		want  []string // one per Add
		flush string
	}{
		{"ascii", []int32{'h', 'i'}, []string{"h", "i"}, ""},
		{"two-byte split", []int32{'h', 0xc3, 0xa9, 'l'}, []string{"h", "", "é", "l"}, ""},
		{"three-byte split", []int32{0xe2, 0x82, 0xac}, []string{"", "", "€"}, ""},
		{"four-byte split", []int32{0xf0, 0x9f, 0x98, 0x80, '!'}, []string{"", "", "", "😀", "!"}, ""},
		{"EOS inside a character adds nothing", []int32{0xe2, EOS, 0x82, EOS, 0xac},
			[]string{"", "", "", "", "€"}, ""},
		{"invalid byte", []int32{'a', 0xff, 'b'}, []string{"a", ff, "b"}, ""},
		{"lone continuation", []int32{0x80}, []string{ff}, ""},
		{"broken sequence then ascii", []int32{0xe2, '('}, []string{"", ff + "("}, ""},
		{"overlong", []int32{0xc0, 0x80}, []string{ff, ff}, ""},
		{"surrogate", []int32{0xed, 0xa0, 0x80}, []string{"", ff + ff, ff}, ""},
		{"incomplete at end", []int32{'x', 0xe2, 0x82}, []string{"x", "", ""}, ff},
		{"out of range ids", []int32{-1, 300, 'z'}, []string{"", "", "z"}, ""},
		{"encoded U+FFFD passes through", []int32{0xef, 0xbf, 0xbd}, []string{"", "", ff}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := byteTokenizer{}.NewDecoder()
			var got []string
			for _, id := range tc.ids {
				got = append(got, d.Add(id))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Add outputs (-want +got):\n%s", diff)
			}
			if f := d.Flush(); f != tc.flush {
				t.Errorf("Flush = %q, want %q", f, tc.flush)
			}
			if f := d.Flush(); f != "" {
				t.Errorf("second Flush = %q, want empty", f)
			}
		})
	}
}

func TestDecoderRoundTrip(t *testing.T) {
	tok := byteTokenizer{}
	text := "hello, 世界! 😀 ünïcödé — ok"
	ids, _ := tok.Encode(text, true)
	d := tok.NewDecoder()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Add(id))
	}
	b.WriteString(d.Flush())
	if b.String() != text {
		t.Errorf("round trip = %q, want %q", b.String(), text)
	}
}

func TestApplyChatTemplateOptions(t *testing.T) {
	tok := newByteTokenizer()
	q := []model.Message{{Role: "user", Content: "hi"}}
	qa := append(q, model.Message{Role: "assistant", Content: "Hel"})
	kw := func(k, v string) map[string]json.RawMessage { return map[string]json.RawMessage{k: json.RawMessage(v)} }
	thinking := "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}" +
		"{% if add_generation_prompt %}assistant:{% if enable_thinking is defined and not enable_thinking %} <no-think>{% endif %}{% endif %}"
	for _, tc := range []struct {
		name    string
		msgs    []model.Message
		opts    model.ChatOptions
		want    string
		wantErr string
	}{
		{name: "no generation prompt", msgs: q, opts: model.ChatOptions{NoGenerationPrompt: true}, want: "<|user|>\nhi\n"},
		{name: "continue final message", msgs: qa, opts: model.ChatOptions{ContinueFinalMessage: true}, want: "<|user|>\nhi\n<|assistant|>\nHel"},
		{name: "continue needs the assistant's", msgs: q, opts: model.ChatOptions{ContinueFinalMessage: true}, wantErr: "needs a final message from the assistant"},
		{name: "template", msgs: q, opts: model.ChatOptions{Template: thinking}, want: "user: hi\nassistant:"},
		{name: "template with kwargs", msgs: q, opts: model.ChatOptions{Template: thinking, Kwargs: kw("enable_thinking", "false")}, want: "user: hi\nassistant: <no-think>"},
		{name: "template, continued", msgs: qa, opts: model.ChatOptions{Template: thinking, ContinueFinalMessage: true}, want: "user: hi\nassistant: Hel"},
		{name: "template without generation prompt", msgs: q, opts: model.ChatOptions{Template: thinking, NoGenerationPrompt: true}, want: "user: hi\n"},
		{name: "template takes any role", msgs: []model.Message{{Role: "tool", Content: "42"}}, opts: model.ChatOptions{Template: thinking}, want: "tool: 42\nassistant:"},
		{name: "template that does not compile", msgs: q, opts: model.ChatOptions{Template: "{% if %}"}, wantErr: "chat_template cannot be compiled"},
		{name: "kwargs with the own format", msgs: q, opts: model.ChatOptions{Kwargs: kw("enable_thinking", "true")}, want: "<|user|>\nhi\n<|assistant|>\n"},
		{name: "reserved kwarg", msgs: q, opts: model.ChatOptions{Kwargs: kw("messages", "[]")}, wantErr: `"messages" may not be set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(tc.msgs, tc.opts)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
			case err != nil || got != tc.want:
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestOwnFormatMatchesTemplate checks that the format rendered without the
// template engine is chatFormat's output for every option.
func TestOwnFormatMatchesTemplate(t *testing.T) {
	tmpl, err := new(tokenizer.TemplateCache).Get(chatFormat)
	if err != nil {
		t.Fatal(err)
	}
	convs := [][]model.Message{
		{{Role: "user", Content: "hi"}},
		{{Role: "system", Content: ""}, {Role: "user", Content: "q"}, {Role: "assistant", Content: " a b \n"}},
		{{Role: "user", Content: "ab"}, {Role: "assistant", Content: "ab"}},
		{{Role: "user", Content: "x"}, {Role: "assistant", Content: ""}},
		{{Role: "user", Content: "é\n"}, {Role: "assistant", Content: "\n\n"}},
	}
	for i, msgs := range convs {
		for _, opts := range []model.ChatOptions{{}, {NoGenerationPrompt: true}, {ContinueFinalMessage: true}} {
			want, werr := tokenizer.RenderChat(tmpl, msgs, opts, nil)
			got, gerr := renderOwn(msgs, opts)
			if got != want || (werr == nil) != (gerr == nil) {
				t.Errorf("conversation %d %+v: own %q, %v; template %q, %v", i, opts, got, gerr, want, werr)
			}
		}
	}
}
