package grammar

import (
	"math/big"
	"strings"
)

// Numeric lexemes. Integers are written canonically (no leading zeros, no
// "-0", no fraction or exponent); a range of integers is a regex built
// digit by digit. A bounded number without exponent is the intersection
// of a "≥ lo" and a "≤ hi" regex over its digits; one with an exponent is
// admitted only where its sign alone (or, for Python's d.ddde-XX, its
// being below 1) puts it in the range; an unbounded number may have an
// exponent.

var (
	digit    = Class(RuneRange{'0', '9'})
	digit19  = Class(RuneRange{'1', '9'})
	jsonNat  = Or(Lit("0"), Concat(digit19, Star(digit)))
	jsonFrac = Concat(Lit("."), Plus(digit))
	// jsonExp's exponent is at most 308 (with up to two leading zeros):
	// every number written then parses to a finite float64, and none
	// above 0 reads as 0 (1e-308 is above the smallest normal double).
	jsonExp = Concat(Class(RuneRange{'e', 'e'}, RuneRange{'E', 'E'}), Opt(Class(RuneRange{'+', '+'}, RuneRange{'-', '-'})),
		Repeat(Lit("0"), 0, 2), natRange(big.NewInt(0), big.NewInt(308)))
	// jsonNumber is any JSON number.
	jsonNumber = Concat(Opt(Lit("-")), jsonNat, Opt(jsonFrac), Opt(jsonExp))
	// jsonInteger is an integer written canonically.
	jsonInteger = Or(Lit("0"), Concat(Opt(Lit("-")), digit19, Star(digit)))
)

// sameLenRange matches the digit strings of a's length between a and b
// (a ≤ b, same length) in value.
func sameLenRange(a, b string) *Regex {
	if a == b {
		return Lit(a)
	}
	if len(a) == 1 {
		return Class(RuneRange{rune(a[0]), rune(b[0])})
	}
	if strings.Trim(a, "0") == "" && strings.Trim(b, "9") == "" {
		// Every string of the length: without this, the two halves
		// below would each recurse into a full range again (2^n calls).
		return Repeat(digit, len(a), len(a))
	}
	if a[0] == b[0] {
		return Concat(Lit(a[:1]), sameLenRange(a[1:], b[1:]))
	}
	n := len(a) - 1
	alts := []*Regex{
		Concat(Lit(a[:1]), sameLenRange(a[1:], strings.Repeat("9", n))),
		Concat(Lit(b[:1]), sameLenRange(strings.Repeat("0", n), b[1:])),
	}
	if a[0]+1 <= b[0]-1 {
		alts = append(alts, Concat(Class(RuneRange{rune(a[0] + 1), rune(b[0] - 1)}), Repeat(digit, n, n)))
	}
	return Or(alts...)
}

// natRange matches the canonical decimal naturals in [lo, hi] (hi nil:
// unbounded); lo ≥ 0.
func natRange(lo, hi *big.Int) *Regex {
	if hi != nil && hi.Cmp(lo) < 0 {
		return None()
	}
	ls := lo.String()
	var alts []*Regex
	if hi == nil {
		alts = append(alts, sameLenRange(ls, strings.Repeat("9", len(ls))))
		alts = append(alts, Concat(digit19, Repeat(digit, len(ls), -1)))
		return Or(alts...)
	}
	hs := hi.String()
	for n := len(ls); n <= len(hs); n++ {
		a, b := strings.Repeat("9", n), strings.Repeat("9", n)
		a = "1" + strings.Repeat("0", n-1)
		if n == 1 {
			a = "0"
		}
		if n == len(ls) {
			a = ls
		}
		if n == len(hs) {
			b = hs
		}
		alts = append(alts, sameLenRange(a, b))
	}
	return Or(alts...)
}

// intRange matches the canonical decimal integers in [lo, hi] (nil:
// unbounded on that side).
func intRange(lo, hi *big.Int) *Regex {
	if lo == nil && hi == nil {
		return jsonInteger
	}
	zero := big.NewInt(0)
	one := big.NewInt(1)
	var alts []*Regex
	// Naturals in [max(lo, 0), hi].
	plo := zero
	if lo != nil && lo.Sign() > 0 {
		plo = lo
	}
	if hi == nil || hi.Sign() >= 0 {
		alts = append(alts, natRange(plo, hi))
	}
	// Negatives -n, n in [max(1, -hi), -lo].
	if lo == nil || lo.Sign() < 0 {
		nlo := one
		if hi != nil && hi.Sign() < 0 {
			nlo = new(big.Int).Neg(hi)
		}
		var nhi *big.Int
		if lo != nil {
			nhi = new(big.Int).Neg(lo)
		}
		alts = append(alts, Concat(Lit("-"), natRange(nlo, nhi)))
	}
	return Or(alts...)
}

// decParts splits a non-negative finite decimal r into its integer part and
// its fraction digits without trailing zeros; ok is false if r has no
// finite decimal expansion.
func decParts(r *big.Rat) (ip *big.Int, frac string, ok bool) {
	ip = new(big.Int).Quo(r.Num(), r.Denom())
	rem := new(big.Rat).Sub(r, new(big.Rat).SetInt(ip))
	var b strings.Builder
	ten := big.NewRat(10, 1)
	for i := 0; rem.Sign() != 0; i++ {
		if i > 400 {
			return nil, "", false
		}
		rem.Mul(rem, ten)
		d := new(big.Int).Quo(rem.Num(), rem.Denom())
		b.WriteByte(byte('0' + d.Int64()))
		rem.Sub(rem, new(big.Rat).SetInt(d))
	}
	return ip, b.String(), true
}

// fracGE matches digit strings s (non-empty) with 0.s ≥ 0.f (> if strict);
// f has no trailing zeros.
func fracGE(f string, strict bool) *Regex {
	if f == "" {
		if strict {
			return Concat(Star(digit), digit19, Star(digit))
		}
		return Plus(digit)
	}
	c := rune(f[0])
	var alts []*Regex
	if c < '9' {
		alts = append(alts, Concat(Class(RuneRange{c + 1, '9'}), Star(digit)))
	}
	if len(f) == 1 {
		if strict {
			alts = append(alts, Concat(Lit(f), Star(digit), digit19, Star(digit)))
		} else {
			alts = append(alts, Concat(Lit(f), Star(digit)))
		}
	} else {
		alts = append(alts, Concat(Lit(f[:1]), fracGE(f[1:], strict)))
	}
	return Or(alts...)
}

// fracLE matches digit strings s (non-empty) with 0.s ≤ 0.f (< if strict);
// f has no trailing zeros.
func fracLE(f string, strict bool) *Regex {
	if f == "" {
		if strict {
			return None()
		}
		return Plus(Lit("0"))
	}
	c := rune(f[0])
	var alts []*Regex
	if c > '0' {
		alts = append(alts, Concat(Class(RuneRange{'0', c - 1}), Star(digit)))
	}
	if len(f) == 1 {
		if !strict {
			alts = append(alts, Concat(Lit(f), Star(Lit("0"))))
		}
	} else {
		alts = append(alts, Concat(Lit(f[:1]), Opt(fracLE(f[1:], strict))))
	}
	return Or(alts...)
}

// decNonNeg is a non-negative number written without sign or exponent.
var decNonNeg = Concat(jsonNat, Opt(jsonFrac))

// decGE matches the unsigned exponent-free decimals ≥ d (> if strict).
func decGE(d *big.Rat, strict bool) (*Regex, bool) {
	if d.Sign() < 0 {
		return decNonNeg, true
	}
	ip, f, ok := decParts(d)
	if !ok {
		return nil, false
	}
	ipS := ip.String()
	above := Concat(natRange(new(big.Int).Add(ip, big.NewInt(1)), nil), Opt(jsonFrac))
	var at *Regex
	if f == "" && !strict {
		at = Concat(Lit(ipS), Opt(jsonFrac))
	} else {
		at = Concat(Lit(ipS), Lit("."), fracGE(f, strict))
	}
	return Or(above, at), true
}

// decLE matches the unsigned exponent-free decimals ≤ d (< if strict).
func decLE(d *big.Rat, strict bool) (*Regex, bool) {
	if d.Sign() < 0 || (d.Sign() == 0 && strict) {
		return None(), true
	}
	ip, f, ok := decParts(d)
	if !ok {
		return nil, false
	}
	ipS := ip.String()
	var alts []*Regex
	if ip.Sign() > 0 {
		alts = append(alts, Concat(natRange(big.NewInt(0), new(big.Int).Sub(ip, big.NewInt(1))), Opt(jsonFrac)))
	}
	if f == "" {
		if !strict {
			alts = append(alts, Concat(Lit(ipS), Opt(Concat(Lit("."), Plus(Lit("0"))))))
		}
	} else {
		alts = append(alts, Concat(Lit(ipS), Opt(Concat(Lit("."), fracLE(f, strict)))))
	}
	return Or(alts...), true
}

// numBound is one side of a numeric range: a value and whether it is
// excluded. A nil *numBound is no bound.
type numBound struct {
	v   *big.Rat
	exc bool
}

// numberRange matches the JSON numbers in the range lo…hi. With a bound,
// numbers are written without exponent. ok is false for a bound without
// a finite decimal expansion.
func numberRange(lo, hi *numBound) (*Regex, bool) {
	if lo == nil && hi == nil {
		return jsonNumber, true
	}
	// Non-negative texts x: x ≥ lo and x ≤ hi.
	// Negative texts -y: y ≥ -hi and y ≤ -lo.
	side := func(ge, le *numBound) (*Regex, bool) {
		parts := []*Regex{decNonNeg}
		if ge != nil {
			r, ok := decGE(ge.v, ge.exc)
			if !ok {
				return nil, false
			}
			parts = append(parts, r)
		}
		if le != nil {
			r, ok := decLE(le.v, le.exc)
			if !ok {
				return nil, false
			}
			parts = append(parts, r)
		}
		return And(parts...), true
	}
	neg := func(b *numBound) *numBound {
		if b == nil {
			return nil
		}
		return &numBound{new(big.Rat).Neg(b.v), b.exc}
	}
	pos, ok := side(lo, hi)
	if !ok {
		return nil, false
	}
	ng, ok := side(neg(hi), neg(lo))
	if !ok {
		return nil, false
	}
	return Or(pos, expForms(lo, hi), Concat(Lit("-"), Or(ng, expForms(neg(hi), neg(lo))))), true
}

var (
	// expAny is an unsigned number with an exponent (value ≥ 0).
	expAny = Concat(jsonNat, Opt(jsonFrac), jsonExp)
	// expSmall is an unsigned number with one integer digit and a negative
	// exponent (0 ≤ value < 1), as Python's repr writes 1e-05.
	// Its exponent is at most 308, as jsonExp's.
	expSmall = Concat(digit, Opt(jsonFrac), Class(RuneRange{'e', 'e'}, RuneRange{'E', 'E'}), Lit("-"), Repeat(Lit("0"), 0, 2), natRange(big.NewInt(1), big.NewInt(308)))
	// zeroMantissa is a mantissa of value 0.
	zeroMantissa = Concat(Lit("0"), Opt(Concat(Lit("."), Plus(Lit("0")))))
)

// expForms is the unsigned numbers with an exponent that are certainly in
// lo…hi (value ≥ 0): all of them when the range is [0, ∞) or wider, those
// below 1 when it is [0, 1] or wider; none otherwise.
func expForms(lo, hi *numBound) *Regex {
	if lo != nil && lo.v.Sign() > 0 {
		return None()
	}
	var r *Regex
	switch {
	case hi == nil:
		r = expAny
	case hi.v.Cmp(big.NewRat(1, 1)) >= 0:
		r = expSmall
	default:
		return None()
	}
	if lo != nil && lo.v.Sign() == 0 && lo.exc {
		r = And(r, Not(Concat(zeroMantissa, jsonExp)))
	}
	return r
}

// integerRange matches the canonical integers in lo…hi.
func integerRange(lo, hi *numBound) *Regex {
	var l, h *big.Int
	if lo != nil {
		// The least integer > lo (exclusive) or ≥ lo.
		l = ratFloor(lo.v)
		if lo.exc || new(big.Rat).SetInt(l).Cmp(lo.v) < 0 {
			l.Add(l, big.NewInt(1))
		}
	}
	if hi != nil {
		h = ratFloor(hi.v)
		if hi.exc && new(big.Rat).SetInt(h).Cmp(hi.v) == 0 {
			h.Sub(h, big.NewInt(1))
		}
	}
	if l != nil && h != nil && l.Cmp(h) > 0 {
		return None()
	}
	return intRange(l, h)
}

// ratFloor is ⌊r⌋.
func ratFloor(r *big.Rat) *big.Int {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	_ = m
	return q
}

// maxMultipleSuffixes bounds the m-digit suffixes listed for a multipleOf.
const maxMultipleSuffixes = 2000

// multipleOfRegex is a regex of the numbers that are multiples of k, for
// the k it handles (ok false otherwise): an integer k dividing a power of
// ten (the last digits decide: intOnly, over canonical integers) and k =
// 10^-m (at most m fraction digits, then zeros; no exponent). rx nil: every
// integer (k = 1).
func multipleOfRegex(k *big.Rat) (rx *Regex, intOnly, ok bool) {
	ten := big.NewInt(10)
	if k.IsInt() {
		K := k.Num()
		if K.Cmp(big.NewInt(1)) == 0 {
			return nil, true, true
		}
		p := big.NewInt(1)
		for m := 1; m <= 6; m++ {
			p.Mul(p, ten)
			if new(big.Int).Mod(p, K).Sign() != 0 {
				continue
			}
			count := new(big.Int).Quo(p, K)
			if count.Cmp(big.NewInt(maxMultipleSuffixes)) > 0 {
				return nil, false, false
			}
			// The numbers of m digits or more end with an m-digit multiple;
			// shorter ones are multiples themselves.
			var suffixes, small []*Regex
			small10 := new(big.Int).Quo(p, ten)
			for x := new(big.Int); x.Cmp(p) < 0; x.Add(x, K) {
				s := x.String()
				suffixes = append(suffixes, Lit(strings.Repeat("0", m-len(s))+s))
				if x.Cmp(small10) < 0 {
					small = append(small, Lit(s))
				}
			}
			r := Or(Concat(Star(digit), Or(suffixes...)), Or(small...))
			return Concat(Opt(Lit("-")), r), true, true
		}
		return nil, false, false
	}
	if k.Num().Cmp(big.NewInt(1)) != 0 {
		return nil, false, false
	}
	d := new(big.Int).Set(k.Denom())
	m := 0
	for d.Cmp(big.NewInt(1)) > 0 && m <= 9 {
		q, r := new(big.Int).QuoRem(d, ten, new(big.Int))
		if r.Sign() != 0 {
			return nil, false, false
		}
		d = q
		m++
	}
	if d.Cmp(big.NewInt(1)) != 0 {
		return nil, false, false
	}
	return Concat(Opt(Lit("-")), jsonNat, Opt(Concat(Lit("."), Repeat(digit, 1, m), Star(Lit("0"))))), false, true
}
