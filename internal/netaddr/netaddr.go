// Package netaddr holds what pdserve's parsers of network addresses share.
package netaddr

import "strings"

// NonNumericPort returns the port of URL raw (scheme://[user@]host:port/...)
// when it has one that is not a decimal number, which url.Parse refuses
// without naming it ("invalid port"); ok is false when raw has no scheme, no
// port, or a decimal one.
func NonNumericPort(raw string) (port string, ok bool) {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "", false
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	rest = rest[strings.LastIndexByte(rest, '@')+1:]
	rest = rest[strings.LastIndexByte(rest, ']')+1:] // after an IPv6 literal
	i := strings.LastIndexByte(rest, ':')
	if i < 0 || i == len(rest)-1 {
		return "", false
	}
	p := rest[i+1:]
	if strings.Trim(p, "0123456789") == "" {
		return "", false
	}
	return p, true
}
