package workerapi

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/pdserve/pdserve/internal/openai"
)

// AppendJSON appends b's JSON, as json.Marshal encodes it, to dst: the
// router encodes one leg body per leg, and encoding/json's reflection was
// the largest single item of its per-request CPU. Strings are escaped as
// JSON requires (quotes, backslashes, control characters; '<', '>' and '&'
// as \u003c, \u003e, \u0026 and invalid UTF-8 as U+FFFD, as json.Marshal
// does), floats formatted as encoding/json formats them. A value
// json.Marshal refuses (a NaN or infinite sampling parameter) is an error.
// TestGenerateBodyAppendJSON and FuzzGenerateBodyAppendJSON compare it
// with json.Marshal byte for byte.
//
// A body that uses a field of a later version (extended) is encoded by
// encoding/json: those requests are rarer, and their fields many.
func (b *GenerateBody) AppendJSON(dst []byte) ([]byte, error) {
	if b.extended() {
		data, err := json.Marshal(b)
		if err != nil {
			return dst, err
		}
		return append(dst, data...), nil
	}
	for _, f := range []float32{b.Temperature, b.TopP} {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			_, err := json.Marshal(b)
			return dst, err
		}
	}
	dst = append(dst, `{"rid":`...)
	dst = appendString(dst, b.RID)
	if b.Room != "" {
		dst = append(dst, `,"room":`...)
		dst = appendString(dst, b.Room)
	}
	if b.Gen != 0 {
		dst = append(dst, `,"gen":`...)
		dst = strconv.AppendUint(dst, uint64(b.Gen), 10)
	}
	dst = append(dst, `,"input_ids":`...)
	dst = appendInt32s(dst, b.InputIDs)
	dst = append(dst, `,"max_tokens":`...)
	dst = strconv.AppendInt(dst, int64(b.MaxTokens), 10)
	dst = append(dst, `,"temperature":`...)
	dst = appendFloat32(dst, b.Temperature)
	if b.TopP != 0 {
		dst = append(dst, `,"top_p":`...)
		dst = appendFloat32(dst, b.TopP)
	}
	if b.TopK != 0 {
		dst = append(dst, `,"top_k":`...)
		dst = strconv.AppendInt(dst, int64(b.TopK), 10)
	}
	dst = append(dst, `,"seed":`...)
	dst = strconv.AppendUint(dst, b.Seed, 10)
	if len(b.StopTokenIDs) > 0 {
		dst = append(dst, `,"stop_token_ids":`...)
		dst = appendInt32s(dst, b.StopTokenIDs)
	}
	if b.IgnoreEOS {
		dst = append(dst, `,"ignore_eos":true`...)
	}
	if b.MinTokens != 0 {
		dst = append(dst, `,"min_tokens":`...)
		dst = strconv.AppendInt(dst, int64(b.MinTokens), 10)
	}
	if b.PrefillKVAddr != "" {
		dst = append(dst, `,"prefill_kv_addr":`...)
		dst = appendString(dst, b.PrefillKVAddr)
	}
	if b.Buffered {
		dst = append(dst, `,"buffered":true`...)
	}
	if b.ContinuedTokens != 0 {
		dst = append(dst, `,"continued_tokens":`...)
		dst = strconv.AppendInt(dst, int64(b.ContinuedTokens), 10)
	}
	return append(dst, '}'), nil
}

// appendInt32s appends ids as a JSON array (null for nil, as encoding/json).
func appendInt32s(dst []byte, ids []int32) []byte {
	if ids == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(id), 10)
	}
	return append(dst, ']')
}

// appendFloat32 formats f as encoding/json does a float32 (finite f):
// 'f' notation, or 'e' below 1e-6 and from 1e21 on with a two-digit
// exponent at least ("1e-07", not "1e-7").
func appendFloat32(dst []byte, f float32) []byte {
	abs := math.Abs(float64(f))
	format := byte('f')
	if abs != 0 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, float64(f), format, -1, 32)
	if format == 'e' {
		// clean up e-09 to e-9
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

// appendString appends s as a JSON string, escaped as json.Marshal escapes
// (HTML characters included).
func appendString(dst []byte, s string) []byte { return openai.AppendJSONString(dst, s, true) }
