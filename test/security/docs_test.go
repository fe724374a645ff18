package security

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// TestDocsKVProtocolVersion: docs/security.md states the KV protocol
// version the binary speaks (kvxfer.ProtocolVersion), in its heading and
// in the HELLO it shows, so neither can drift from the code.
func TestDocsKVProtocolVersion(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.Itoa(kvxfer.ProtocolVersion)
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^## The KV channel handshake \(protocol version (\d+)\)$`),
		regexp.MustCompile(`HELLO\{version (\d+),`),
	} {
		m := re.FindAllSubmatch(b, -1)
		if len(m) == 0 {
			t.Errorf("docs/security.md: nothing matches %s", re)
		}
		for _, g := range m {
			if string(g[1]) != want {
				t.Errorf("docs/security.md: %q, but the KV protocol version is %s", g[0], want)
			}
		}
	}
}
