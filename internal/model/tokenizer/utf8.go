package tokenizer

import "unicode/utf8"

// appendUTF8 appends the text of b to dst, replacing every maximal subpart
// of an ill-formed sequence by one U+FFFD, the practice of the Unicode
// Standard (§3.9, "U+FFFD Substitution of Maximal Subparts") that Rust's
// String::from_utf8_lossy (Hugging Face tokenizers) and the WHATWG
// TextDecoder (transformers.js) follow.
//
// If atEOF is false, an incomplete but so far well-formed sequence at the end
// of b is left unconsumed so that the next bytes can complete it. It returns
// the extended dst and the number of bytes of b consumed.
func appendUTF8(dst, b []byte, atEOF bool) ([]byte, int) {
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		n, lo, hi := seqInfo(c)
		if n == 0 {
			dst = append(dst, "\uFFFD"...)
			i++
			continue
		}
		k := 1
		for ; k < n; k++ {
			if i+k >= len(b) {
				break
			}
			x := b[i+k]
			if k == 1 && (x < lo || x > hi) || k > 1 && (x < 0x80 || x > 0xBF) {
				break
			}
		}
		switch {
		case k == n:
			dst = append(dst, b[i:i+n]...)
			i += n
		case i+k >= len(b) && !atEOF:
			return dst, i // incomplete: wait for more bytes
		default:
			dst = append(dst, "\uFFFD"...)
			i += k
		}
	}
	return dst, i
}

// seqInfo returns the length of the UTF-8 sequence that lead byte c starts
// and the range of its second byte (Unicode Table 3-7), or n == 0 if c
// cannot start a sequence.
func seqInfo(c byte) (n int, lo, hi byte) {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 2, 0x80, 0xBF
	case c == 0xE0:
		return 3, 0xA0, 0xBF
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		return 3, 0x80, 0xBF
	case c == 0xED:
		return 3, 0x80, 0x9F
	case c == 0xF0:
		return 4, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 4, 0x80, 0xBF
	case c == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}
