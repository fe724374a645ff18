package sim

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/tokenizer"
)

// Token ids of the simulated model's vocabulary.
const (
	// EOS ends generation; it decodes to no text.
	EOS int32 = 256
	// VocabSize counts the byte tokens 0…255 and EOS.
	VocabSize = 257
)

// byteTokenizer maps text to its UTF-8 bytes, one token per byte. It is
// safe for concurrent use. The zero value compiles chat templates on every
// call; newByteTokenizer's share a cache.
type byteTokenizer struct {
	templates *tokenizer.TemplateCache // nil: none
}

var _ model.Tokenizer = byteTokenizer{}

// chatFormat is the simulated model's own chat template (see
// ApplyChatTemplate).
const chatFormat = "{% if tools %}<|tools|>\n{{ tools | tojson }}\n{% endif %}" +
	"{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n" +
	"{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>\n{% endfor %}{% endfor %}" +
	"{% if add_generation_prompt %}<|assistant|>\n{% endif %}"

func newByteTokenizer() byteTokenizer {
	return byteTokenizer{templates: new(tokenizer.TemplateCache)}
}

// Encode returns the bytes of text as token ids; there is no BOS. Empty text
// gives an empty, non-nil slice.
func (byteTokenizer) Encode(text string, _ bool) ([]int32, error) {
	ids := make([]int32, len(text))
	for i := range len(text) {
		ids[i] = int32(text[i])
	}
	return ids, nil
}

// knownRole reports whether ApplyChatTemplate accepts role.
func knownRole(role string) bool {
	switch role {
	case "system", "developer", "user", "assistant", "tool":
		return true
	}
	return false
}

// ApplyChatTemplate renders "<|role|>\ncontent\n" per message (an
// assistant's tool calls follow as "<tool_call>{name, arguments}</tool_call>"
// lines; opts.Tools, when set, come first as "<|tools|>\n[…]\n") and then
// "<|assistant|>\n" (not with opts.NoGenerationPrompt or
// opts.ContinueFinalMessage, which also ends the text right after the last
// message's content), or renders opts.Template instead; both go through
// tokenizer.RenderChat, so opts.Kwargs are template variables, refused
// under the reserved names, as for a real model. It rejects an empty
// conversation and, with its own format, roles other than system,
// developer, user, assistant and tool.
func (t byteTokenizer) ApplyChatTemplate(msgs []model.Message, opts model.ChatOptions) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("chat template: no messages")
	}
	src := opts.Template
	if src == "" {
		src = chatFormat
		for i, m := range msgs {
			if !knownRole(m.Role) {
				return "", fmt.Errorf("chat template: message %d has unknown role %q (want system, developer, user, assistant or tool)", i, m.Role)
			}
		}
	}
	if opts.Template == "" && len(opts.Kwargs) == 0 && opts.Tools == nil && !hasToolCalls(msgs) {
		return renderOwn(msgs, opts)
	}
	cache := t.templates
	if cache == nil {
		cache = new(tokenizer.TemplateCache)
	}
	tmpl, err := cache.Get(src)
	if err != nil {
		return "", err
	}
	return tokenizer.RenderChat(tmpl, msgs, opts, nil)
}

// hasToolCalls reports whether an assistant's message of msgs made calls.
func hasToolCalls(msgs []model.Message) bool {
	for _, m := range msgs {
		if len(m.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// renderOwn is chatFormat rendered without the template engine (a chat
// request without a template, kwargs, tools or tool calls: the common case, 20 times
// faster), with the same result as tokenizer.RenderChat gives.
func renderOwn(msgs []model.Message, opts model.ChatOptions) (string, error) {
	cont := opts.ContinueFinalMessage
	if cont && msgs[len(msgs)-1].Role != "assistant" {
		return "", fmt.Errorf("chat template: continue_final_message needs a final message from the assistant")
	}
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	if cont {
		return tokenizer.ContinueFinal(b.String(), msgs[len(msgs)-1].Content)
	}
	if !opts.NoGenerationPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String(), nil
}

// TokenBytes returns the byte of a byte token, nothing for EOS, and nil
// outside the vocabulary.
func (byteTokenizer) TokenBytes(id int32) []byte {
	switch {
	case id >= 0 && id < 256:
		return []byte{byte(id)}
	case id == EOS:
		return []byte{}
	}
	return nil
}

// IsSpecial reports EOS, the one special token (model.SpecialTokens).
func (byteTokenizer) IsSpecial(id int32) bool { return id == EOS }

// NewDecoder returns an incremental UTF-8 decoder of byte tokens.
func (byteTokenizer) NewDecoder() model.Decoder { return &byteDecoder{} }

// byteDecoder holds back the bytes of an incomplete UTF-8 character. pending
// is always a proper prefix of a valid encoding, so it holds at most 3 bytes
// between calls.
type byteDecoder struct {
	pending [utf8.UTFMax]byte
	n       int
}

// Add appends byte token id and returns the characters it completes. Bytes
// that cannot start or continue a valid encoding become U+FFFD, one per byte.
// EOS and ids outside 0…255 add nothing.
func (d *byteDecoder) Add(id int32) string {
	if id < 0 || id > 255 {
		return ""
	}
	d.pending[d.n] = byte(id)
	d.n++
	p := d.pending[:d.n]
	var out string
	for len(p) > 0 && utf8.FullRune(p) {
		r, size := utf8.DecodeRune(p)
		if r == utf8.RuneError && size == 1 {
			out += string(utf8.RuneError)
		} else {
			out += string(p[:size])
		}
		p = p[size:]
	}
	d.n = copy(d.pending[:], p)
	return out
}

// Flush returns U+FFFD for a held-back incomplete character (one per
// character, as for any truncated sequence) and resets the decoder.
func (d *byteDecoder) Flush() string {
	if d.n == 0 {
		return ""
	}
	d.n = 0
	return string(utf8.RuneError)
}
