package tests

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestHTTPAuthToken: an instance started with DISPATCHER_HTTP_AUTH_TOKEN
// serves the status page and /metrics only to a request that carries the
// token, the probes to anyone, and never writes the token to its log.
func TestHTTPAuthToken(t *testing.T) {
	const token = "tok-7f3c9a1e5b2d4c6e8a0f"
	h := newHarness(t, queueSpec{Name: "auth", Shards: 2})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_HTTP_AUTH_TOKEN"] = token
	p := h.start()
	waitStarted(t, p)
	status := func(path, auth string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		path, auth string
		want       int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/", "", http.StatusUnauthorized},
		{"/metrics", "Bearer not-the-token-at-all", http.StatusUnauthorized},
		{"/metrics", "Bearer " + token, http.StatusOK},
		{"/", "Bearer " + token, http.StatusOK},
		{"/healthz", "", http.StatusOK},
	} {
		code, body := status(c.path, c.auth)
		if code != c.want {
			t.Errorf("GET %s (auth %v): %d, want %d: %s", c.path, c.auth != "", code, c.want, tail(body, 300))
		}
		if code == http.StatusOK && c.path == "/metrics" && !strings.Contains(body, "dispatcher_") {
			t.Errorf("/metrics with the token serves no dispatcher metrics")
		}
	}
	if code, body := status("/readyz", ""); code == http.StatusUnauthorized {
		t.Errorf("/readyz asks for the token: %s", body)
	}
	if strings.Contains(p.out.String(), token) {
		t.Errorf("the token appears in the log")
	}
}
