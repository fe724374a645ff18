package registry

import (
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for raw, want := range map[string]string{
		"http://127.0.0.1:30000":  "http://127.0.0.1:30000",
		"http://127.0.0.1:30000/": "http://127.0.0.1:30000",
		"https://w.example":       "https://w.example",
		"http://[::1]:65535":      "http://[::1]:65535",
	} {
		if got, err := ParseURL(raw); err != nil || got != want {
			t.Errorf("ParseURL(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"http://127.0.0.1:70000", "http://127.0.0.1:0", "http://127.0.0.1:", "http://:30000",
		"http://h:030000", "ftp://h:1", "http://h:1/path", "127.0.0.1:30000", "http://u@h:1"} {
		if got, err := ParseURL(raw); err == nil {
			t.Errorf("ParseURL(%q) = %q, want an error", raw, got)
		}
	}
}

// TestParseURLNamesANonNumericPort: a worker URL whose port is not a
// number says so, naming the port, rather than only what it wants.
func TestParseURLNamesANonNumericPort(t *testing.T) {
	// The cases of the port's parse are netaddr's; these check the message.
	for raw, port := range map[string]string{"http://host:notaport": "notaport", "http://[::1]:eighty?q": "eighty"} {
		_, err := ParseURL(raw)
		want := `worker URL "` + raw + `": port "` + port + `" is not a number`
		if err == nil || err.Error() != want {
			t.Errorf("ParseURL(%q) = %v, want %q", raw, err, want)
		}
	}
}

func TestEntryValidate(t *testing.T) {
	ok := Entry{ID: "p", Role: RolePrefill, URL: "http://h:1", KVAddr: "h:2"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"h:70000", "h:0", ":2", "h", "h:x"} {
		e := ok
		e.KVAddr = kv
		if err := e.Validate(); err == nil || !strings.Contains(err.Error(), "kv_addr") {
			t.Errorf("kv_addr %q: %v, want an error naming kv_addr", kv, err)
		}
	}
	e := ok
	e.URL = "http://h:99999"
	if err := e.Validate(); err == nil || !strings.Contains(err.Error(), "65535") {
		t.Errorf("URL port 99999: %v", err)
	}
}
