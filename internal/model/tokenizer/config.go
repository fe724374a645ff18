package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/pdserve/pdserve/internal/model"
)

// specialTokenKeys are the special tokens of tokenizer_config.json passed to
// chat templates when set, as transformers' SPECIAL_TOKENS_ATTRIBUTES
// (additional_special_tokens aside).
var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// tokenizerConfig is what this package uses of tokenizer_config.json.
type tokenizerConfig struct {
	path     string
	template string // "" if none
	// templateErr explains why there is no usable template.
	templateErr error
	special     map[string]string // key in specialTokenKeys → token content
	addBOS      *bool
	addEOS      *bool
}

// readConfig reads dir/tokenizer_config.json (and dir/chat_template.jinja
// when the config has no chat_template).
func readConfig(dir string) (*tokenizerConfig, error) {
	path := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %v", path, err)
	}
	cfg := &tokenizerConfig{path: path, special: map[string]string{}}
	for _, key := range specialTokenKeys {
		tok, err := tokenContent(raw[key])
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %v", path, key, err)
		}
		if tok != "" {
			cfg.special[key] = tok
		}
	}
	for _, f := range []struct {
		key string
		dst **bool
	}{{"add_bos_token", &cfg.addBOS}, {"add_eos_token", &cfg.addEOS}} {
		if v, ok := raw[f.key]; ok && !isNull(v) {
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return nil, fmt.Errorf("%s: %s must be a boolean, got %s", path, f.key, v)
			}
			*f.dst = &b
		}
	}
	if v, ok := raw["chat_template"]; ok && !isNull(v) {
		cfg.template, cfg.templateErr = chooseTemplate(v)
		if cfg.templateErr != nil {
			cfg.templateErr = fmt.Errorf("%s: chat_template: %w", path, cfg.templateErr)
		}
		return cfg, nil
	}
	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	switch tmpl, err := os.ReadFile(jinjaPath); {
	case err == nil:
		cfg.template = string(tmpl)
	case errors.Is(err, fs.ErrNotExist):
		cfg.templateErr = fmt.Errorf("the model has no chat template (%s has no chat_template and there is no chat_template.jinja)", path)
	default:
		return nil, err
	}
	return cfg, nil
}

// tokenContent reads a special token of tokenizer_config.json: a string,
// an AddedToken object {"content": …}, or null ("").
func tokenContent(v json.RawMessage) (string, error) {
	if isNull(v) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(v, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("want a string or an object with content, got %s", v)
	}
	return *obj.Content, nil
}

// chooseTemplate reads chat_template: a string, or a list of
// {"name", "template"} of which the one named "default" is used (as
// transformers does when no tools are given).
func chooseTemplate(v json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(v, &list); err != nil {
		return "", fmt.Errorf("want a string or a list of {name, template}, got %.40s", v)
	}
	var names []string
	for _, t := range list {
		if t.Name == "default" {
			return t.Template, nil
		}
		names = append(names, fmt.Sprintf("%q", t.Name))
	}
	return "", fmt.Errorf("no template named \"default\" (have %s)", strings.Join(names, ", "))
}

// configure applies tokenizer_config.json: special tokens, add_bos_token /
// add_eos_token, and the chat template.
func (t *Tokenizer) configure(cfg *tokenizerConfig) error {
	if bos, ok := cfg.special["bos_token"]; ok {
		id, ok := t.tokenID(bos)
		if !ok {
			return fmt.Errorf("bos_token %q is not a token of the vocabulary", bos)
		}
		t.bos = id
	}
	if eos, ok := cfg.special["eos_token"]; ok {
		id, ok := t.tokenID(eos)
		if !ok {
			return fmt.Errorf("eos_token %q is not a token of the vocabulary", eos)
		}
		t.addEOS(id)
	}
	// add_bos_token / add_eos_token: true asks for the token around every
	// sequence with special tokens, as transformers' Llama tokenizer
	// builds into its post-processor; it is added here unless the
	// post-processor adds it already. false (or absent) leaves the
	// post-processor of tokenizer.json as it is, as Hugging Face
	// tokenizers and transformers.js do.
	if cfg.addBOS != nil && *cfg.addBOS && t.bos >= 0 && (len(t.prefix) == 0 || t.prefix[0] != t.bos) {
		t.prefix = append([]int32{t.bos}, t.prefix...)
	}
	if cfg.addEOS != nil && *cfg.addEOS && len(t.eos) > 0 {
		eos := t.eos[0]
		if len(t.suffix) == 0 || t.suffix[len(t.suffix)-1] != eos {
			t.suffix = append(t.suffix, eos)
		}
	}
	c := &chatTemplate{err: cfg.templateErr, vars: map[string]jinja.Value{}, src: cfg.template}
	for k, v := range cfg.special {
		c.vars[k] = jinja.NewString(v)
	}
	if cfg.templateErr == nil {
		tmpl, err := jinja.Compile(cfg.template)
		if err != nil {
			c.err = fmt.Errorf("%s: the chat template cannot be compiled: %w", cfg.path, err)
		} else {
			c.tmpl = tmpl
		}
	}
	t.chat = c
	return nil
}

// chatTemplate is a compiled chat template and its fixed variables.
type chatTemplate struct {
	tmpl *jinja.Template // nil: err says why
	err  error
	vars map[string]jinja.Value
	src  string // the template's text
}

// ApplyChatTemplate renders msgs with the model's chat template, or with
// opts.Template (compiled through the tokenizer's TemplateCache), as
// transformers' apply_chat_template(msgs, tokenize=False) does (RenderChat):
// the variables are messages (a list of {role, content} dicts, in that key
// order), add_generation_prompt (true unless opts says otherwise), tools
// and documents (none), the special tokens of tokenizer_config.json that
// are set (bos_token, eos_token, unk_token, sep_token, pad_token,
// cls_token, mask_token), and opts.Kwargs. Jinja's trim_blocks and
// lstrip_blocks are on, as in transformers. The result is meant for
// Encode(…, false): it holds the template's own BOS. It returns an error if
// the model has no usable template (and opts none), opts.Template does not
// compile or exceeds MaxTemplateBytes, a kwarg is invalid or reserved,
// ContinueFinalMessage cannot be honoured, or the template fails (e.g.
// raise_exception for a role order it rejects).
func (t *Tokenizer) ApplyChatTemplate(msgs []model.Message, opts model.ChatOptions) (string, error) {
	c := t.chat
	tmpl := c.tmpl
	if opts.Template != "" {
		var err error
		if tmpl, err = t.templates.Get(opts.Template); err != nil {
			return "", err
		}
	} else if tmpl == nil {
		return "", c.err
	}
	return RenderChat(tmpl, msgs, opts, c.vars)
}
