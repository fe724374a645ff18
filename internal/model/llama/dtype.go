package llama

import (
	"fmt"
	"math"

	"github.com/pdserve/pdserve/internal/kvcache"
)

// DType is the element type of a weight tensor: the KV cache's element
// types (kvcache.DType), read from and written to safetensors headers under
// their safetensors names ("F32", "F16", "BF16").
type DType = kvcache.DType

// Weight element types.
const (
	F32  = kvcache.F32  // IEEE 754 binary32, 4 bytes
	F16  = kvcache.F16  // IEEE 754 binary16, 2 bytes
	BF16 = kvcache.BF16 // bfloat16 (the top 16 bits of a binary32), 2 bytes
)

// safetensorsName is d's name in a safetensors header.
func safetensorsName(d DType) string {
	switch d {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// parseDType maps a safetensors dtype name to a DType. Other names (I64, F64,
// F8_E4M3, …) are valid safetensors but not weights this package computes
// with; the error names them.
func parseDType(s string) (DType, error) {
	switch s {
	case "F32":
		return F32, nil
	case "F16":
		return F16, nil
	case "BF16":
		return BF16, nil
	}
	return 0, fmt.Errorf("unsupported dtype %q (want BF16, F16 or F32)", s)
}

// BF16ToF32 widens a bfloat16 (bit pattern) to float32 exactly: bfloat16 is
// the upper half of a binary32 (Google Brain's bfloat16 format).
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even, as PyTorch's
// float→bfloat16 conversion does. NaN stays a (quiet) NaN.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep the sign, set the quiet bit
		return uint16(u>>16) | 0x0040
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE 754 binary16 (bit pattern) to float32 exactly,
// including subnormals, infinities and NaN.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0: // normal: rebias 15 → 127
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0: // ±0
		return math.Float32frombits(sign)
	}
	// Subnormal: man·2^-24, exactly representable as a normal binary32.
	f := float32(man) * (1.0 / (1 << 24))
	return math.Float32frombits(sign | math.Float32bits(f))
}

// F32ToF16 rounds f to the nearest binary16, ties to even. Values beyond the
// largest finite binary16 (65504) round to ±Inf; NaN stays NaN.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	man := u & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // binary16 biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal (or zero) in binary16: value = m·2^-24 with m < 1024.
		if e < -10 {
			return sign // rounds to ±0
		}
		m := man | 0x800000 // implicit leading 1
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++ // may carry into the smallest normal, which is the right result
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to Inf: correct rounding
	}
	return sign | uint16(r)
}
