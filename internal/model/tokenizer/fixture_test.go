package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The fixtures are written by tools/tokenizer-fixtures/gen.mjs: the real
// tokenizer files (gzip-compressed) and what transformers.js computes.

// models are the fixture directories under testdata.
var models = []string{"llama3", "qwen3"}

type encodeCase struct {
	Text       string  `json:"text"`
	IDs        []int32 `json:"ids"`
	IDsSpecial []int32 `json:"ids_special"`
	Decoded    string  `json:"decoded"`
}

type expected struct {
	Encode []encodeCase `json:"encode"`
	Decode []struct {
		IDs  []int32 `json:"ids"`
		Text string  `json:"text"`
	} `json:"decode"`
	Chat []struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	} `json:"chat"`
	Variants []struct {
		Name    string                     `json:"name"`
		Replace map[string]json.RawMessage `json:"replace"`
		Encode  []encodeCase               `json:"encode"`
	} `json:"variants"`
}

func readExpected(t testing.TB, name string) *expected {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var e expected
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("%s/expected.json: %v", name, err)
	}
	return &e
}

// gunzipFile returns the decompressed content of a fixture file.
func gunzipFile(name, file string) ([]byte, error) {
	f, err := os.Open(filepath.Join("testdata", name, file+".gz"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// writeFixtureDir decompresses fixture name into dir. edit, if not nil,
// rewrites tokenizer.json first.
func writeFixtureDir(dir, name string, edit func(map[string]json.RawMessage)) error {
	for _, file := range []string{"tokenizer.json", "tokenizer_config.json"} {
		data, err := gunzipFile(name, file)
		if err != nil {
			return err
		}
		if file == "tokenizer.json" && edit != nil {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(data, &m); err != nil {
				return err
			}
			edit(m)
			if data, err = json.Marshal(m); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// fixtureDir decompresses fixture name into a t.TempDir() and returns it.
func fixtureDir(t testing.TB, name string, edit func(map[string]json.RawMessage)) string {
	t.Helper()
	dir := t.TempDir()
	if err := writeFixtureDir(dir, name, edit); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shared holds one loaded tokenizer per fixture for the whole test binary:
// loading the real vocabularies takes a good part of a second (more under
// -race), and a Tokenizer is safe for concurrent use.
var shared = map[string]func() (*Tokenizer, error){}

func init() {
	for _, name := range models {
		shared[name] = sync.OnceValues(func() (*Tokenizer, error) {
			dir, err := os.MkdirTemp("", "tokenizer-"+name+"-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(dir)
			if err := writeFixtureDir(dir, name, nil); err != nil {
				return nil, err
			}
			return Load(dir)
		})
	}
}

func loadShared(t testing.TB, name string) *Tokenizer {
	t.Helper()
	tok, err := shared[name]()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// caseName is a short printable test name for text.
func caseName(i int, text string) string {
	r := []rune(text)
	if len(r) > 24 {
		r = r[:24]
	}
	return fmt.Sprintf("%02d_%q", i, string(r))
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// firstDiff describes where got and want differ, with the tokens around.
func firstDiff(tok *Tokenizer, got, want []int32) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	show := func(ids []int32) string {
		var b bytes.Buffer
		for j := max(0, i-2); j < min(len(ids), i+4); j++ {
			fmt.Fprintf(&b, "%d:%q ", ids[j], tok.TokenString(ids[j]))
		}
		return b.String()
	}
	return fmt.Sprintf("len %d vs %d, first difference at %d\n got  %s\n want %s", len(got), len(want), i, show(got), show(want))
}
