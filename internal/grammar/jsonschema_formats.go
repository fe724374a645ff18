package grammar

// The string formats CompileJSONSchema enforces, as ECMA-262 patterns over
// the decoded string (anchored). Sources: RFC 3339 §5.6 (date-time,
// full-date, full-time), RFC 3339 Appendix A (duration), RFC 4122 (uuid),
// RFC 2673/3986 §3.2.2 (ipv4 dotted quad), RFC 4291 §2.2 (ipv6 text
// forms), RFC 1123 §2.1 (hostname labels), RFC 5321 §4.1.2 simplified
// (email: dot-atom local part @ hostname), RFC 3986 (uri: scheme ":"
// then URI characters, no IP-literal brackets; uri-reference: a URI, or a
// relative reference whose first segment has no ":"), RFC 6901
// (json-pointer) and draft-handrews-relative-json-pointer.
// Day-of-month is checked per month (February up to 29, leap years not
// distinguished). A leap second (:60) is not admitted: RFC 3339 allows it
// only at 23:59:60 UTC, which a regex of local times cannot tell, and
// validators refuse the others. An email's local part is at most 64
// characters and the address at most 254 (RFC 5321 §4.5.3.1).
const (
	fmtDate     = `[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))`
	fmtTime     = `(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])`
	fmtDurDate  = `(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)`
	fmtDurTime  = `T(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)`
	fmtOctet    = `(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`
	fmtIPv4     = fmtOctet + `(?:\.` + fmtOctet + `){3}`
	fmtH16      = `[0-9a-fA-F]{1,4}`
	fmtLS32     = `(?:` + fmtH16 + `:` + fmtH16 + `|` + fmtIPv4 + `)`
	fmtLabel    = `[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?`
	fmtHostname = fmtLabel + `(?:\.` + fmtLabel + `)*`
	fmtURIChar  = `(?:[A-Za-z0-9\-._~:/?#@!$&'()*+,;=]|%[0-9a-fA-F]{2})`
	fmtURINC    = `(?:[A-Za-z0-9\-._~@!$&'()*+,;=]|%[0-9a-fA-F]{2})`
	fmtAtom     = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
)

// jsonFormats maps each enforced format to its pattern.
var jsonFormats = map[string]string{
	"date":      fmtDate,
	"time":      fmtTime,
	"date-time": fmtDate + `[Tt]` + fmtTime,
	"duration":  `P(?:` + fmtDurDate + `(?:` + fmtDurTime + `)?|` + fmtDurTime + `|[0-9]+W)`,
	"uuid":      `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`,
	"ipv4":      fmtIPv4,
	"ipv6": `(?:(?:` + fmtH16 + `:){6}` + fmtLS32 +
		`|::(?:` + fmtH16 + `:){5}` + fmtLS32 +
		`|(?:` + fmtH16 + `)?::(?:` + fmtH16 + `:){4}` + fmtLS32 +
		`|(?:(?:` + fmtH16 + `:){0,1}` + fmtH16 + `)?::(?:` + fmtH16 + `:){3}` + fmtLS32 +
		`|(?:(?:` + fmtH16 + `:){0,2}` + fmtH16 + `)?::(?:` + fmtH16 + `:){2}` + fmtLS32 +
		`|(?:(?:` + fmtH16 + `:){0,3}` + fmtH16 + `)?::` + fmtH16 + `:` + fmtLS32 +
		`|(?:(?:` + fmtH16 + `:){0,4}` + fmtH16 + `)?::` + fmtLS32 +
		`|(?:(?:` + fmtH16 + `:){0,5}` + fmtH16 + `)?::` + fmtH16 +
		`|(?:(?:` + fmtH16 + `:){0,6}` + fmtH16 + `)?::)`,
	"hostname":              `(?=.{1,253}$)` + fmtHostname,
	"email":                 fmtAtom + `(?:\.` + fmtAtom + `)*@` + fmtHostname,
	"uri":                   `[A-Za-z][A-Za-z0-9+.\-]*:` + fmtURIChar + `*`,
	"uri-reference":         `(?:[A-Za-z][A-Za-z0-9+.\-]*:` + fmtURIChar + `*|` + fmtURINC + `*(?:[/?#]` + fmtURIChar + `*)?)`,
	"json-pointer":          `(?:/(?:[^~/]|~[01])*)*`,
	"relative-json-pointer": `(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~[01])*)*)`,
}

// refusedFormats are formats a validator checks that are not enforced
// here: a schema using one is refused rather than left unchecked.
var refusedFormats = map[string]bool{
	"idn-email": true, "idn-hostname": true, "iri": true, "iri-reference": true,
	"uri-template": true, "regex": true,
}

// formatRegex is the language of format f: ok false if f is not enforced
// (an unknown format is an annotation, as JSON Schema 2020-12 §7.2 makes
// it); err for a format that is refused.
func formatRegex(f string) (*Regex, bool, error) {
	if refusedFormats[f] {
		return nil, false, ErrUnsupported
	}
	p, ok := jsonFormats[f]
	if !ok {
		return nil, false, nil
	}
	if f == "email" {
		local, err := ParseRegex(fmtAtom + `(?:\.` + fmtAtom + `)*`)
		if err != nil {
			return nil, false, err
		}
		host, err := ParseRegex(fmtHostname)
		if err != nil {
			return nil, false, err
		}
		return And(Concat(And(local, Repeat(AnyChar(), 1, 64)), Lit("@"), host), Repeat(AnyChar(), 3, 254)), true, nil
	}
	if f == "hostname" {
		// Lookahead is not in the pattern dialect: bound the length apart.
		h, err := ParseRegex(fmtHostname)
		if err != nil {
			return nil, false, err
		}
		return And(h, Repeat(AnyChar(), 1, 253)), true, nil
	}
	r, err := ParseRegex(p)
	if err != nil {
		return nil, false, err
	}
	return r, true, nil
}
