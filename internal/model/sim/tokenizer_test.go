package sim

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/model"
)

func TestEncode(t *testing.T) {
	tok := byteTokenizer{}
	for _, tc := range []struct {
		text string
		want []int32
	}{
		{"", []int32{}},
		{"hi", []int32{'h', 'i'}},
		{"é€", []int32{0xc3, 0xa9, 0xe2, 0x82, 0xac}},
	} {
		got, err := tok.Encode(tc.text, true)
		if err != nil {
			t.Fatalf("Encode(%q): %v", tc.text, err)
		}
		if got == nil {
			t.Errorf("Encode(%q) = nil, want a non-nil slice", tc.text)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Encode(%q) (-want +got):\n%s", tc.text, diff)
		}
	}
}

func TestApplyChatTemplate(t *testing.T) {
	tok := byteTokenizer{}
	for _, tc := range []struct {
		name    string
		msgs    []model.Message
		want    string
		wantErr string
	}{
		{
			name: "system and user",
			msgs: []model.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
			want: "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n",
		},
		{
			name: "multi turn with developer",
			msgs: []model.Message{{Role: "developer", Content: "d"}, {Role: "user", Content: "q"},
				{Role: "assistant", Content: "a"}, {Role: "user", Content: ""}},
			want: "<|developer|>\nd\n<|user|>\nq\n<|assistant|>\na\n<|user|>\n\n<|assistant|>\n",
		},
		{name: "unknown role", msgs: []model.Message{{Role: "user", Content: "x"}, {Role: "tool", Content: "y"}},
			wantErr: `message 1 has unknown role "tool"`},
		{name: "no messages", wantErr: "no messages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(tc.msgs, model.ChatOptions{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecoder(t *testing.T) {
	const ff = "\uFFFD"
	for _, tc := range []struct {
		name  string
		ids   []int32
		want  []string // one per Add
		flush string
	}{
		{"ascii", []int32{'h', 'i'}, []string{"h", "i"}, ""},
		{"two-byte split", []int32{'h', 0xc3, 0xa9, 'l'}, []string{"h", "", "é", "l"}, ""},
		{"three-byte split", []int32{0xe2, 0x82, 0xac}, []string{"", "", "€"}, ""},
		{"four-byte split", []int32{0xf0, 0x9f, 0x98, 0x80, '!'}, []string{"", "", "", "😀", "!"}, ""},
		{"EOS inside a character adds nothing", []int32{0xe2, EOS, 0x82, EOS, 0xac},
			[]string{"", "", "", "", "€"}, ""},
		{"invalid byte", []int32{'a', 0xff, 'b'}, []string{"a", ff, "b"}, ""},
		{"lone continuation", []int32{0x80}, []string{ff}, ""},
		{"broken sequence then ascii", []int32{0xe2, '('}, []string{"", ff + "("}, ""},
		{"overlong", []int32{0xc0, 0x80}, []string{ff, ff}, ""},
		{"surrogate", []int32{0xed, 0xa0, 0x80}, []string{"", ff + ff, ff}, ""},
		{"incomplete at end", []int32{'x', 0xe2, 0x82}, []string{"x", "", ""}, ff},
		{"out of range ids", []int32{-1, 300, 'z'}, []string{"", "", "z"}, ""},
		{"encoded U+FFFD passes through", []int32{0xef, 0xbf, 0xbd}, []string{"", "", ff}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := byteTokenizer{}.NewDecoder()
			var got []string
			for _, id := range tc.ids {
				got = append(got, d.Add(id))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Add outputs (-want +got):\n%s", diff)
			}
			if f := d.Flush(); f != tc.flush {
				t.Errorf("Flush = %q, want %q", f, tc.flush)
			}
			if f := d.Flush(); f != "" {
				t.Errorf("second Flush = %q, want empty", f)
			}
		})
	}
}

func TestDecoderRoundTrip(t *testing.T) {
	tok := byteTokenizer{}
	text := "hello, 世界! 😀 ünïcödé — ok"
	ids, _ := tok.Encode(text, true)
	d := tok.NewDecoder()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Add(id))
	}
	b.WriteString(d.Flush())
	if b.String() != text {
		t.Errorf("round trip = %q, want %q", b.String(), text)
	}
}
