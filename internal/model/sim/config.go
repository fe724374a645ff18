package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// DefaultName is the model name when Config.Name is empty.
const DefaultName = "pdserve-sim"

// DefaultContextLen is the context length in tokens when Config.ContextLen is
// 0: Llama 3 8B's max_position_embeddings (8192, from its config.json).
const DefaultContextLen = 8192

// DefaultGeometry is the Llama-3-8B KV shape: 32 layers, 8 KV heads, head
// dimension 128 (hidden 4096 / 32 attention heads), bf16 — 131072 bytes
// (128 KiB) per token. Source: meta-llama/Meta-Llama-3-8B config.json
// (num_hidden_layers 32, num_key_value_heads 8, hidden_size 4096,
// num_attention_heads 32, torch_dtype bfloat16).
func DefaultGeometry() kvcache.Geometry {
	return kvcache.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvcache.BF16}
}

// Config parameterises the simulated model. Zero fields take the documented
// defaults; see DefaultConfig.
type Config struct {
	// Name is the served model name; "" means DefaultName.
	Name string
	// Geometry is the KV shape; the zero Geometry means DefaultGeometry().
	Geometry kvcache.Geometry
	// ContextLen is the maximum positions of a sequence (prompt + output), in
	// tokens; 0 means DefaultContextLen.
	ContextLen int
	// PrefillPerToken is the simulated compute time per prefill token (see
	// Model.StepLatency); 0 means prefill takes no simulated time.
	PrefillPerToken time.Duration
	// DecodePerStep is the simulated time of one batched decode step,
	// independent of the batch size; 0 means decode takes no simulated time.
	DecodePerStep time.Duration
	// Profile, if set, replaces PrefillPerToken and DecodePerStep with a
	// GPU-like step time (see Profile).
	Profile *Profile
	// Sleep waits d or until ctx is done, returning ctx.Err() in that case.
	// nil means a real timer. Tests inject a fake. It is never called with
	// d ≤ 0.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultConfig returns the defaults spelled out: DefaultName,
// DefaultGeometry(), DefaultContextLen, no simulated latency, real timers.
func DefaultConfig() Config {
	return Config{Name: DefaultName, Geometry: DefaultGeometry(), ContextLen: DefaultContextLen}
}

// withDefaults fills zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Geometry == (kvcache.Geometry{}) {
		c.Geometry = DefaultGeometry()
	}
	if c.ContextLen == 0 {
		c.ContextLen = DefaultContextLen
	}
	if c.Sleep == nil {
		c.Sleep = timerSleep
	}
	if err := c.Geometry.Validate(); err != nil {
		return c, fmt.Errorf("sim: %w", err)
	}
	if c.ContextLen < 0 {
		return c, fmt.Errorf("sim: context length must be positive, got %d tokens", c.ContextLen)
	}
	if c.PrefillPerToken < 0 {
		return c, fmt.Errorf("sim: prefill time per token must not be negative, got %v", c.PrefillPerToken)
	}
	if c.DecodePerStep < 0 {
		return c, fmt.Errorf("sim: decode step time must not be negative, got %v", c.DecodePerStep)
	}
	return c, nil
}

// timerSleep waits d on a real timer or until ctx is done.
func timerSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
