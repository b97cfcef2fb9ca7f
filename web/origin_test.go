package web

import (
	"net/url"
	"testing"
)

// The websocket Origin check is exact, so the allowed origin must be
// spelled as browsers send it.
func TestOriginOfPublicURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://console.example.com":      "https://console.example.com",
		"https://Console.Example.COM:443/": "https://console.example.com",
		"HTTPS://console.example.com:8443": "https://console.example.com:8443",
		"http://127.0.0.1:80":              "http://127.0.0.1",
		"http://127.0.0.1:8080":            "http://127.0.0.1:8080",
		"http://[::1]:8080":                "http://[::1]:8080",
		"https://console.example.com:80":   "https://console.example.com:80",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := originOf(u); got != want {
			t.Errorf("originOf(%q) = %q, want %q", in, got, want)
		}
	}
}
