package grammar

import (
	"math/big"
	"strconv"
)

// negate is the node of the values schema v does not admit ("not"). A
// schema is the conjunction of its keywords, so its negation is the union
// of the negations of each keyword (De Morgan). A keyword that constrains
// one type (pattern, minimum …) is satisfied by the other types, so its
// negation holds values of that type only. Keywords whose negation is not
// built exactly are refused.
func (c *jsCompiler) negate(v *jval, path string, depth int) (*node, error) {
	if depth > maxSchemaNesting {
		return nil, errAt("not", path, "subschemas nested more than %d deep", maxSchemaNesting)
	}
	switch v.k {
	case jBool:
		if v.b {
			return neverNode(path), nil
		}
		return anyNode(path), nil
	case jObj:
	default:
		return nil, errAt("not", path, "a schema must be an object or a boolean")
	}
	u := &node{path: path, isUnion: true}
	add := func(n *node) {
		if !n.never() {
			u.alts = append(u.alts, n)
		}
	}
	only := func(t tset) *node {
		n := anyNode(path)
		n.types = t
		return n
	}
	for i, kw := range v.keys {
		x := v.vals[i]
		kp := path + "/" + jsonPtrEscape(kw)
		if v.get("$ref") != nil && kw != "$ref" && c.legacyRef || c.ignored(kw) {
			continue
		}
		switch kw {
		case "not":
			n, err := c.normalize(x, kp, depth+1)
			if err != nil {
				return nil, err
			}
			add(n)
		case "type":
			n, err := c.normalize(&jval{k: jObj, keys: []string{"type"}, vals: []*jval{x}}, path, depth+1)
			if err != nil {
				return nil, err
			}
			t := n.types
			if t&tNum == 0 && t&tInt != 0 {
				// Not an integer: the other types, and numbers with a
				// non-zero fraction (written without exponent).
				frac := only(tInt | tNum)
				frac.numPatterns = []*Regex{Concat(Opt(Lit("-")), jsonNat, Lit("."), Star(digit), digit19, Star(digit))}
				add(frac)
				t |= tInt | tNum
			}
			add(only(tAll &^ t))
		case "required":
			if x.k != jArr {
				return nil, errAt(kw, kp, "must be an array of strings")
			}
			for _, e := range x.arr {
				if e.k != jStr {
					return nil, errAt(kw, kp, "must be an array of strings")
				}
				n := only(tObj)
				n.props = []prop{{e.s, neverNode(kp)}}
				add(n)
			}
		case "properties":
			if x.k != jObj {
				return nil, errAt(kw, kp, "must be an object")
			}
			for j, name := range x.keys {
				s, err := c.negate(x.vals[j], kp+"/"+jsonPtrEscape(name), depth+1)
				if err != nil {
					return nil, err
				}
				n := only(tObj)
				n.props = []prop{{name, s}}
				n.required = []string{name}
				add(n)
			}
		case "enum", "const":
			vals := []*jval{x}
			if kw == "enum" {
				if x.k != jArr {
					return nil, errAt(kw, kp, "must be an array")
				}
				vals = x.arr
			}
			n := anyNode(path)
			var strs, nums []*Regex
			bools := 0
			for _, e := range vals {
				switch e.k {
				case jStr:
					strs = append(strs, Lit(e.s))
				case jNull:
					n.types &^= tNull
				case jBool:
					if e.b {
						bools |= 1
					} else {
						bools |= 2
					}
				case jNum:
					sp, ok := numberSpellings(e)
					if !ok {
						return nil, unsupportedAt("not", kp, "the negation of %s is not enforced", e)
					}
					nums = append(nums, sp)
				default:
					return nil, unsupportedAt("not", kp, "the negation of a list holding %s is not enforced", e)
				}
			}
			if len(nums) > 0 {
				// Numbers without exponent, so that every spelling of an
				// excluded value is known.
				n.numPatterns = []*Regex{And(Concat(Opt(Lit("-")), decNonNeg), Not(Or(nums...)))}
			}
			if bools != 0 {
				// The other boolean stays as an enumerated value.
				n.types &^= tBool
				if bools != 3 {
					add(&node{path: path, types: tBool, hasEnum: true, enum: []*jval{{k: jBool, b: bools == 2}}, maxLen: -1, maxProps: -1, maxItems: -1})
				}
			}
			if len(strs) > 0 {
				n.patterns = []*Regex{Not(Or(strs...))}
			}
			add(n)
		case "pattern":
			if x.k != jStr {
				return nil, errAt(kw, kp, "must be a string")
			}
			rx, err := ParsePattern(x.s)
			if err != nil {
				return nil, wrapRxErr(err, kw, kp)
			}
			n := only(tStr)
			n.patterns = []*Regex{Not(rx)}
			add(n)
		case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
			if x.k == jBool {
				continue
			}
			r := x.rat()
			if r == nil {
				return nil, errAt(kw, kp, "must be a number")
			}
			exc := kw == "exclusiveMinimum" || kw == "exclusiveMaximum"
			if kw == "minimum" || kw == "maximum" {
				if e := v.get("exclusiveM" + kw[1:]); e != nil && e.k == jBool && e.b {
					exc = true
				}
			}
			n := only(tInt | tNum)
			if kw == "minimum" || kw == "exclusiveMinimum" {
				n.hi = &numBound{r, !exc}
			} else {
				n.lo = &numBound{r, !exc}
			}
			add(n)
		case "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties":
			k, err := nonNegInt(x, kw, kp)
			if err != nil {
				return nil, err
			}
			var t tset
			switch kw {
			case "minLength", "maxLength":
				t = tStr
			case "minItems", "maxItems":
				t = tArr
			default:
				t = tObj
			}
			if kw[:3] == "min" && k == 0 {
				continue
			}
			n := only(t)
			switch kw {
			case "minLength":
				n.maxLen = k - 1
			case "maxLength":
				n.minLen = k + 1
			case "minItems":
				n.maxItems = k - 1
			case "maxItems":
				n.minItems = k + 1
			case "minProperties":
				n.maxProps = k - 1
			case "maxProperties":
				n.minProps = k + 1
			}
			add(n)
		case "anyOf":
			if x.k != jArr || len(x.arr) == 0 {
				return nil, errAt(kw, kp, "must be a non-empty array")
			}
			var acc *node
			for j, e := range x.arr {
				s, err := c.negate(e, kp+"/"+strconv.Itoa(j), depth+1)
				if err != nil {
					return nil, err
				}
				if acc == nil {
					acc = s
				} else if acc, err = c.merge(acc, s, 0); err != nil {
					return nil, err
				}
			}
			add(acc)
		case "allOf":
			if x.k != jArr || len(x.arr) == 0 {
				return nil, errAt(kw, kp, "must be a non-empty array")
			}
			for j, e := range x.arr {
				s, err := c.negate(e, kp+"/"+strconv.Itoa(j), depth+1)
				if err != nil {
					return nil, err
				}
				add(s)
			}
		case "format":
			if x.k != jStr {
				return nil, errAt(kw, kp, "must be a string")
			}
			rx, ok, err := formatRegex(x.s)
			if err != nil || !ok && c.o.StrictFormats {
				return nil, unsupportedAt("not", kp, "the negation of format %q is not enforced", x.s)
			}
			if ok {
				n := only(tStr)
				n.patterns = []*Regex{Not(rx)}
				add(n)
			}
		case "multipleOf":
			r := x.rat()
			if r == nil || r.Sign() <= 0 {
				return nil, errAt(kw, kp, "must be a positive number")
			}
			rx, intOnly, ok := multipleOfRegex(r)
			if !ok {
				return nil, unsupportedAt("not", kp, "the negation of multipleOf %s is not enforced", x)
			}
			// Numbers written without exponent that are not multiples.
			plain := Concat(Opt(Lit("-")), decNonNeg)
			n := only(tInt | tNum)
			if rx == nil {
				rx = jsonInteger
			}
			if intOnly {
				// Integers that are not multiples, and non-integers.
				frac := Concat(Opt(Lit("-")), jsonNat, Lit("."), Star(digit), digit19, Star(digit))
				n.numPatterns = []*Regex{Or(And(jsonInteger, Not(rx)), frac)}
			} else {
				n.numPatterns = []*Regex{And(plain, Not(rx))}
			}
			add(n)
		case "oneOf":
			// Not exactly one: none, or two at least.
			if x.k != jArr || len(x.arr) == 0 {
				return nil, errAt(kw, kp, "must be a non-empty array")
			}
			var none *node
			var pos []*node
			for j, e := range x.arr {
				bp := kp + "/" + strconv.Itoa(j)
				ng, err := c.negate(e, bp, depth+1)
				if err != nil {
					return nil, err
				}
				if none == nil {
					none = ng
				} else if none, err = c.merge(none, ng, 0); err != nil {
					return nil, err
				}
				p, err := c.normalize(e, bp, depth+1)
				if err != nil {
					return nil, err
				}
				pos = append(pos, p)
			}
			add(none)
			for j := range pos {
				for k := j + 1; k < len(pos); k++ {
					m, err := c.merge(pos[j], pos[k], 0)
					if err != nil {
						return nil, err
					}
					add(m)
				}
			}
		case "additionalProperties":
			// Some member named outside properties and patternProperties
			// whose value fails the schema.
			w := &extraWitness{}
			if ps := v.get("properties"); ps != nil && ps.k == jObj && !c.ignored("properties") {
				w.names = ps.keys
			}
			if pp := v.get("patternProperties"); pp != nil && pp.k == jObj {
				for _, src := range pp.keys {
					rx, err := ParsePattern(src)
					if err != nil {
						return nil, wrapRxErr(err, "patternProperties", path+"/patternProperties/"+jsonPtrEscape(src))
					}
					w.pats = append(w.pats, rx)
				}
			}
			val, err := c.negate(x, kp, depth+1)
			if err != nil {
				return nil, err
			}
			if !val.never() {
				n := only(tObj)
				n.someExtras = []*extraWitness{w}
				w.val = val
				add(n)
			}
		case "propertyNames":
			// Some member whose name fails the schema.
			pn, err := c.normalize(x, kp, depth+1)
			if err != nil {
				return nil, err
			}
			holder := anyNode(path)
			holder.propNames = pn
			names, err := c.keyContent(holder)
			if err != nil {
				return nil, err
			}
			if names == nil {
				continue // every name passes: the negation is empty
			}
			n := only(tObj)
			n.someExtras = []*extraWitness{{match: Not(names), val: anyNode(kp)}}
			add(n)
		case "patternProperties":
			// Some member whose name matches a pattern and whose value
			// fails its schema.
			if x.k != jObj {
				return nil, errAt(kw, kp, "must be an object")
			}
			for j, src := range x.keys {
				rx, err := ParsePattern(src)
				if err != nil {
					return nil, wrapRxErr(err, kw, kp+"/"+jsonPtrEscape(src))
				}
				val, err := c.negate(x.vals[j], kp+"/"+jsonPtrEscape(src), depth+1)
				if err != nil {
					return nil, err
				}
				if !val.never() {
					n := only(tObj)
					n.someExtras = []*extraWitness{{match: rx, val: val}}
					add(n)
				}
			}
		case "items", "contains":
			if kw == "items" && (x.k == jArr || v.get("prefixItems") != nil) {
				return nil, unsupportedAt("not", kp, "the negation of tuple items is not enforced")
			}
			if kw == "contains" && (v.get("minContains") != nil || v.get("maxContains") != nil) {
				return nil, unsupportedAt("not", kp, "the negation of minContains/maxContains is not enforced")
			}
			s, err := c.negate(x, kp, depth+1)
			if err != nil {
				return nil, err
			}
			n := only(tArr)
			if kw == "items" {
				n.contains = s // some element fails items
			} else {
				n.items = s // no element matches contains
			}
			add(n)
		case "$ref":
			t, err := c.refTarget(x, kp)
			if err != nil {
				return nil, err
			}
			tv, err := c.lookup(t, kp)
			if err != nil {
				return nil, err
			}
			s, err := c.negate(tv, t, depth+1)
			if err != nil {
				return nil, err
			}
			add(s)
		default:
			if knownKeywords[kw] || refusedKeywords[kw] {
				return nil, unsupportedAt("not", kp, "the negation of %s is not enforced", kw)
			}
		}
	}
	if len(u.alts) == 1 {
		return u.alts[0], nil
	}
	return u, nil
}

// numberSpellings matches every exponent-free JSON spelling of number v
// (trailing fraction zeros, and -0 for 0).
func numberSpellings(v *jval) (*Regex, bool) {
	r := v.rat()
	if r == nil {
		return nil, false
	}
	sign := Empty()
	if r.Sign() < 0 {
		sign = Lit("-")
	} else if r.Sign() == 0 {
		sign = Opt(Lit("-"))
	}
	ip, f, ok := decParts(new(big.Rat).Abs(r))
	if !ok {
		return nil, false
	}
	zeros := Star(Lit("0"))
	if f == "" {
		return Concat(sign, Lit(ip.String()), Opt(Concat(Lit("."), Plus(Lit("0"))))), true
	}
	return Concat(sign, Lit(ip.String()+"."+f), zeros), true
}
