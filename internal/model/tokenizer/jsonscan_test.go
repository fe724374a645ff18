package tokenizer

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestParseVocab(t *testing.T) {
	t.Parallel()
	want := map[string]int32{"\"": 0, "\\": 1, "\x00": 2, "é": 3, "😀": 4, "\u2028": 5, "<\x01>": 6, "Ġhello": 7, "": 8}
	data, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseVocab(data)
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("parseVocab(%s) = %v, %v", data, got, err)
	}
	// Escapes as other writers produce them agree with encoding/json.
	escaped := []byte(` { "\u00e9" : 1 , "\ud83d\ude00":2, "\ud800":3, "\ud800\u0041":4, "a\/b\n\t\"":5, "dup": 6, "dup": 7 } `)
	var ref map[string]int32
	if err := json.Unmarshal(escaped, &ref); err != nil {
		t.Fatal(err)
	}
	got, err = parseVocab(escaped)
	if err != nil || !maps.Equal(got, ref) {
		t.Fatalf("parseVocab(%s) = %q, %v; encoding/json gives %q", escaped, got, err, ref)
	}
	for _, bad := range []string{
		`{"a": -1}`, `{"a": 1.5}`, `{"a" 1}`, `{"a": 1,}`, `{"a": 99999999999}`, `["x"]`,
		`{"a": 1} x`, `{"a": 01}`, `{"a\q": 1}`, "{\"a\x01\": 1}", `{"\u12": 1}`, `{"a": 1`, "{\"\xff\": 1}", ``,
	} {
		if _, err := parseVocab([]byte(bad)); err == nil {
			t.Errorf("parseVocab(%q) succeeded, want an error", bad)
		}
	}
}

func TestParseMergeList(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want [][2]string
	}{
		{`["a b", "c d e"]`, [][2]string{{"a", "b"}, {"c", "d e"}}},
		{`[["a","b"], [ "\u0120" , "x" ]]`, [][2]string{{"a", "b"}, {"Ġ", "x"}}},
		{` [ ] `, nil},
	} {
		got, err := parseMergeList([]byte(c.in))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("parseMergeList(%s) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{`["ab"]`, `[["a"]]`, `[["a","b","c"]]`, `[1]`, `["a b",]`, `{"a b": 1}`, `["a b"`} {
		if _, err := parseMergeList([]byte(bad)); err == nil {
			t.Errorf("parseMergeList(%s) succeeded, want an error", bad)
		}
	}
}

func TestObjectMembers(t *testing.T) {
	t.Parallel()
	in := `{"a": {"b": [1, -2.5e3, true, false, null, "x\"y}"]}, "c" : "v", "e": {}, "f": []}`
	got, err := objectMembers([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": `{"b": [1, -2.5e3, true, false, null, "x\"y}"]}`, "c": `"v"`, "e": `{}`, "f": `[]`}
	for k, v := range want {
		if string(got[k]) != v {
			t.Errorf("member %q = %s, want %s", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d members, want %d", len(got), len(want))
	}
	for _, bad := range []string{
		`{"a": tru}`, `{"a": "unterminated}`, `{"a": [1 2]}`, `{"a": {1: 2}}`, `{"a": 1}}`, `[]`,
		`{"a": --1}`, `{"a": ` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
	} {
		if _, err := objectMembers([]byte(bad)); err == nil {
			t.Errorf("objectMembers(%.60s) succeeded, want an error", bad)
		}
	}
}

// FuzzParseVocab checks parseVocab against encoding/json: whatever it
// accepts, encoding/json reads the same way.
func FuzzParseVocab(f *testing.F) {
	f.Add(`{"a": 1, "\u00e9": 2}`)
	f.Add(`{"\ud83d\ude00": 0}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseVocab([]byte(s))
		if err != nil {
			return
		}
		var ref map[string]int32
		if err := json.Unmarshal([]byte(s), &ref); err != nil {
			t.Fatalf("parseVocab accepted %q, encoding/json says %v", s, err)
		}
		if !maps.Equal(got, ref) {
			t.Fatalf("parseVocab(%q) = %q, encoding/json %q", s, got, ref)
		}
	})
}
