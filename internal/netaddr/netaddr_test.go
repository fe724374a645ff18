package netaddr

import "testing"

func TestNonNumericPort(t *testing.T) {
	for raw, want := range map[string]string{
		"http://host:notaport":        "notaport",
		"http://host:80x/":            "80x",
		"https://u@h:p0rt":            "p0rt",
		"http://[::1]:eighty?q":       "eighty",
		"grpc://10.0.0.1:3o000/v1":    "3o000",
		"http://host:notaport#anchor": "notaport",
	} {
		if got, ok := NonNumericPort(raw); !ok || got != want {
			t.Errorf("NonNumericPort(%q) = %q, %v; want %q, true", raw, got, ok, want)
		}
	}
	for _, raw := range []string{"http://host:8080", "http://host", "http://host:", "host:notaport", "http://[::1]", "http://u:pw@host/x:y"} {
		if got, ok := NonNumericPort(raw); ok {
			t.Errorf("NonNumericPort(%q) = %q, true; want none", raw, got)
		}
	}
}
