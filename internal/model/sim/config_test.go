package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
)

func TestNewDefaults(t *testing.T) {
	for _, cfg := range []Config{{}, DefaultConfig()} {
		m := newModel(t, cfg)
		want := model.Info{
			Name:       "pdserve-sim",
			Geometry:   kvcache.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DType: kvcache.BF16},
			ContextLen: 8192,
			VocabSize:  257,
			EOS:        []int32{256},
		}
		got := m.Info()
		if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(model.Info{}, "Digest")); diff != "" {
			t.Errorf("Info (-want +got):\n%s", diff)
		}
		if got.Geometry.BytesPerToken() != 128<<10 {
			t.Errorf("default bytes per token = %d, want 128 KiB", got.Geometry.BytesPerToken())
		}
		if !strings.HasPrefix(got.Digest, "sim-v3-") {
			t.Errorf("Digest = %q, want a sim-v3- prefix", got.Digest)
		}
		if m.Tokenizer() == nil {
			t.Error("Tokenizer() = nil")
		}
	}
}

func TestInfoEOSIsACopy(t *testing.T) {
	m := newModel(t, Config{Geometry: geoSmall})
	m.Info().EOS[0] = 7
	if got := m.Info().EOS; !cmp.Equal(got, []int32{EOS}) {
		t.Errorf("EOS after a caller's write = %v", got)
	}
}

func TestNewRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"partial geometry", Config{Geometry: kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 0, DType: kvcache.F16}}, "invalid KV geometry"},
		{"unknown dtype", Config{Geometry: kvcache.Geometry{Layers: 2, KVHeads: 2, HeadDim: 8}}, "invalid KV geometry"},
		{"negative context", Config{ContextLen: -1}, "context length must be positive, got -1"},
		{"negative prefill time", Config{PrefillPerToken: -time.Millisecond}, "prefill time per token must not be negative"},
		{"negative decode time", Config{DecodePerStep: -time.Millisecond}, "decode step time must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, %v; want error containing %q", m, err, tc.want)
			}
		})
	}
}

func TestDigest(t *testing.T) {
	base := Config{Geometry: geoSmall}
	digest := func(cfg Config) string { return newModel(t, cfg).Info().Digest }
	d0 := digest(base)
	if d := digest(base); d != d0 {
		t.Errorf("same config: digests %q and %q differ", d0, d)
	}
	same := base
	same.ContextLen, same.PrefillPerToken, same.DecodePerStep = 100, time.Second, time.Second
	if d := digest(same); d != d0 {
		t.Errorf("context length and latency changed the digest: %q vs %q", d, d0)
	}
	for name, mod := range map[string]func(*Config){
		"name":     func(c *Config) { c.Name = "other" },
		"layers":   func(c *Config) { c.Geometry.Layers++ },
		"kv_heads": func(c *Config) { c.Geometry.KVHeads++ },
		"head_dim": func(c *Config) { c.Geometry.HeadDim++ },
		"dtype":    func(c *Config) { c.Geometry.DType = kvcache.BF16 },
	} {
		cfg := base
		mod(&cfg)
		if d := digest(cfg); d == d0 {
			t.Errorf("changing %s kept digest %q", name, d)
		}
	}
}
