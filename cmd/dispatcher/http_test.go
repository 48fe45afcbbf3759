package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestListenAddr(t *testing.T) {
	tests := []struct {
		addr, network, bind string
		loopback            bool
	}{
		{":9090", "tcp4", "127.0.0.1:9090", true},
		{":0", "tcp4", "127.0.0.1:0", true},
		{"127.0.0.1:9090", "tcp4", "127.0.0.1:9090", false},
		{"0.0.0.0:9090", "tcp4", "0.0.0.0:9090", false},
		{"10.1.2.3:9090", "tcp4", "10.1.2.3:9090", false},
		{"[::]:9090", "tcp", "[::]:9090", false},
		{"[::1]:9090", "tcp", "[::1]:9090", false},
		{"localhost:9090", "tcp", "localhost:9090", false},
	}
	for _, tt := range tests {
		network, bind, loopback, err := listenAddr(tt.addr)
		if err != nil || network != tt.network || bind != tt.bind || loopback != tt.loopback {
			t.Errorf("listenAddr(%q) = %q, %q, %v, %v; want %q, %q, %v", tt.addr, network, bind, loopback, err, tt.network, tt.bind, tt.loopback)
		}
	}
	for _, bad := range []string{"9090", "host", "[::1", "a:b:c"} {
		if _, _, _, err := listenAddr(bad); err == nil {
			t.Errorf("listenAddr(%q) accepted", bad)
		}
	}
}

// TestProtect: with a token, the status page and /metrics answer 401
// without it or with a wrong one (naming the setting, not the token), 200
// with it as a bearer token or a basic-auth password; the probes answer
// without it. Without a token nothing is checked.
func TestProtect(t *testing.T) {
	const token = "s3cret-token-0123456789"
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "served") })
	for _, c := range []struct {
		token, path, auth string
		basic             string // basic-auth password, if any
		want              int
	}{
		{token, "/metrics", "", "", http.StatusUnauthorized},
		{token, "/", "", "", http.StatusUnauthorized},
		{token, "/metrics", "Bearer wrong-token-0123456789", "", http.StatusUnauthorized},
		{token, "/metrics", "Bearer " + token[:len(token)-1], "", http.StatusUnauthorized},
		{token, "/metrics", "Bearer " + token, "", http.StatusOK},
		{token, "/", "Bearer " + token, "", http.StatusOK},
		{token, "/", "", token, http.StatusOK},
		{token, "/", "", "nope", http.StatusUnauthorized},
		{token, "/healthz", "", "", http.StatusOK},
		{token, "/readyz", "", "", http.StatusOK},
		{"", "/metrics", "", "", http.StatusOK},
	} {
		r := httptest.NewRequest(http.MethodGet, c.path, nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		if c.basic != "" {
			r.SetBasicAuth("anyone", c.basic)
		}
		w := httptest.NewRecorder()
		protect(c.token, ok).ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("token %v, GET %s with %q/%q: %d, want %d", c.token != "", c.path, c.auth, c.basic, w.Code, c.want)
		}
		if w.Code == http.StatusUnauthorized {
			if body := w.Body.String(); strings.Contains(body, token) || !strings.Contains(body, "DISPATCHER_HTTP_AUTH_TOKEN") {
				t.Errorf("401 body %q: want the setting named and the token not shown", body)
			}
			if w.Header().Get("WWW-Authenticate") == "" {
				t.Errorf("401 without WWW-Authenticate")
			}
		}
	}
}
