package tokenizer

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// LoadMaybeGzipped is Load, also for a directory holding only gzipped
// files (tokenizer.json.gz and tokenizer_config.json.gz, as the
// repository's test fixtures keep them): those are decompressed into a
// temporary directory, removed before it returns. Errors are Load's, or of
// reading and decompressing the files.
func LoadMaybeGzipped(dir string) (*Tokenizer, error) {
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		return Load(dir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	gz, err := filepath.Glob(filepath.Join(dir, "*.json.gz"))
	if err != nil {
		return nil, err
	}
	if len(gz) == 0 {
		return nil, fmt.Errorf("%s: no tokenizer.json or tokenizer.json.gz", dir)
	}
	tmp, err := os.MkdirTemp("", "tokenizer-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, p := range gz {
		if err := gunzipTo(p, filepath.Join(tmp, filepath.Base(p[:len(p)-len(".gz")]))); err != nil {
			return nil, err
		}
	}
	return Load(tmp)
}

// gunzipTo decompresses file src into a new file dst.
func gunzipTo(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %v", src, err)
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, zr); err != nil {
		out.Close()
		return fmt.Errorf("%s: %v", src, err)
	}
	return out.Close()
}
