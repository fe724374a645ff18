package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/pdserve/pdserve/internal/model/llama"
	"github.com/pdserve/pdserve/internal/model/llama/gguf"
	"github.com/pdserve/pdserve/internal/model/llama2c"
)

// StoriesRef is one file of llama.cpp references for a quantized
// stories260K GGUF (read by internal/model/llama's TestStories260KGGUF).
type StoriesRef struct {
	Type       string          `json:"type"`
	GGUFSHA256 string          `json:"gguf_sha256"`
	Generator  string          `json:"generator"`
	Sequences  json.RawMessage `json:"sequences"`
}

// writeStoriesRefs converts the stories260K fixture, writes it as Q8_0,
// Q4_0 and Q5_0 GGUF with llama.WriteGGUF, and records llama.cpp's next-token
// probabilities after each fixture sequence and its 32-token greedy
// continuation (bench.mjs refs) into dir/stories260K-TYPE.json.
func writeStoriesRefs(root, work, dir string, threads int) {
	fixture := filepath.Join(root, "internal", "model", "llama", "testdata", "stories260K")
	ckpt := filepath.Join(work, "stories260K")
	_, err := llama2c.Convert(filepath.Join(fixture, "stories260K.bin"), ckpt)
	must(err)
	files, err := filepath.Glob(filepath.Join(fixture, "reference", "seq-*.json"))
	must(err)
	sort.Strings(files)
	var seqs [][]int32
	for _, f := range files {
		raw, err := os.ReadFile(f)
		must(err)
		var r struct {
			Tokens []int32 `json:"tokens"`
		}
		must(json.Unmarshal(raw, &r))
		seqs = append(seqs, r.Tokens)
	}
	seqPath := filepath.Join(work, "stories-seqs.json")
	must(os.WriteFile(seqPath, mustJSON(seqs), 0o644))
	must(os.MkdirAll(dir, 0o755))
	for _, typ := range []gguf.Type{gguf.Q8_0, gguf.Q4_0, gguf.Q5_0} {
		path := filepath.Join(work, "stories260K-"+typ.String()+".gguf")
		rep, err := llama.WriteGGUF(ckpt, path, llama.FileType(typ.String()))
		must(err)
		raw, err := os.ReadFile(path)
		must(err)
		sum := sha256.Sum256(raw)
		out := node(work, threads, "refs", "--model", path, "--seqs", seqPath, "--greedy", "32")
		ref := StoriesRef{Type: typ.String(), GGUFSHA256: hex.EncodeToString(sum[:]),
			Generator: "llama.cpp (node-llama-cpp 3.21.1 prebuilt CPU build), " + strconv.Itoa(threads) + " threads, F32 KV cache, flash attention off; " +
				"the GGUF written by llama.WriteGGUF from stories260K.bin (matrices kept in another type: " + strconv.Quote(list2(rep.Fallback)) + ")",
			Sequences: json.RawMessage(lastLine(out))}
		dst := filepath.Join(dir, "stories260K-"+typ.String()+".json")
		must(os.WriteFile(dst, append(mustJSON(ref), '\n'), 0o644))
		log.Printf("wrote %s (%d tensors, %d bytes of GGUF)", dst, rep.Tensors, rep.Bytes)
	}
}

func list2(s []string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
