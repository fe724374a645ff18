package tokenizer

import "unicode/utf8"

// The byte-level alphabet of GPT-2, used by Hugging Face tokenizers'
// ByteLevel pre-tokenizer and decoder (tokenizers/src/pre_tokenizers/byte_level.rs,
// bytes_char): every byte is shown as one printable character so that BPE
// vocabularies hold only printable strings. The bytes '!'..'~', '¡'..'¬' and
// '®'..'ÿ' stand for themselves; the other 68 bytes (controls, space, DEL,
// NBSP, soft hyphen, …) map, in byte order, to U+0100, U+0101, ….
type byteAlphabet struct {
	toRune [256]rune
	// toByte maps a rune below 0x144 back to its byte, or -1.
	toByte [0x144]int16
}

func newByteAlphabet() *byteAlphabet {
	a := &byteAlphabet{}
	for i := range a.toByte {
		a.toByte[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		a.toRune[b] = r
		a.toByte[r] = int16(b)
	}
	return a
}

// appendRunes appends the byte-level form of s (one character per byte).
func (a *byteAlphabet) appendRunes(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = utf8.AppendRune(dst, a.toRune[s[i]])
	}
	return dst
}

// decodeToken returns the bytes a byte-level token stands for. As in
// tokenizers' ByteLevel decoder, a token holding any character outside the
// alphabet (an added token such as "<|eot_id|> " with a real space) is taken
// as its own UTF-8 bytes.
func (a *byteAlphabet) decodeToken(tok string) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r < 0 || int(r) >= len(a.toByte) || a.toByte[r] < 0 {
			return []byte(tok)
		}
		out = append(out, byte(a.toByte[r]))
	}
	return out
}
