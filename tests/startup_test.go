package tests

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// Start-up and Redis connectivity as an operator meets them: the endpoint
// while Redis is not there yet, settings Redis refuses for good, and the
// log of an outage.

// getStatus returns the status code and body of a GET.
func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEndpointsWhileWaitingForRedis: while Redis is unreachable at start,
// the endpoint serves already: /healthz 200 (a liveness probe must not
// restart a process that only waits), /readyz 503 naming Redis as
// unreachable without its password, /metrics, and the status page saying
// it waits for Redis. Once Redis is there, the instance dispatches and
// /readyz turns 200.
func TestEndpointsWhileWaitingForRedis(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Users: []string{"user app on >app-s3cr3tPW ~* &* +@all"}})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: "early", Shards: 4})
	srv.Kill()
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_REDIS_URL"] = srv.URLFor("app", "app-s3cr3tPW")
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	p := h.start()
	waitLogged(t, p, "waiting for Redis", 10*time.Second)

	base := "http://" + addr
	if code, body := getStatus(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while waiting for Redis: %d %q", code, body)
	}
	code, body := getStatus(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis: unreachable") {
		t.Errorf("/readyz while waiting for Redis: %d %q, want 503 naming \"redis: unreachable\"", code, body)
	}
	if code, body := getStatus(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics while waiting for Redis: %d", code)
	}
	code, page := getStatus(t, base+"/")
	if code != http.StatusOK || !strings.Contains(page, "waiting for Redis") {
		t.Errorf("status page while waiting for Redis: %d, does not say it waits for Redis:\n%s", code, page)
	}
	for _, s := range []string{body, page, p.out.String()} {
		if strings.Contains(s, "s3cr3tPW") {
			t.Errorf("a password is shown:\n%s", s)
		}
	}

	srv.Restart()
	srv.WaitLoaded(10 * time.Second)
	waitLogged(t, p, "dispatching", 15*time.Second)
	eventually(t, 15*time.Second, "/readyz 200 once Redis is there", func() bool {
		code, _ := getStatus(t, base+"/readyz")
		return code == http.StatusOK
	})
	if code, page := getStatus(t, base+"/"); code != http.StatusOK || strings.Contains(page, "waiting for Redis") {
		t.Errorf("status page after start: %d, still says it waits for Redis", code)
	}
}

// TestPermanentRedisRefusals: answers of Redis that no amount of waiting
// changes (a database index the server does not have, a wrong password,
// none where one is required, an ACL user without a command the
// dispatcher needs) end the start with exit code 2 and one line, as bad
// settings do, without the password; `dispatcher stats` says the same.
func TestPermanentRedisRefusals(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"databases 16"}, Users: []string{
		"user default on >def-s3cr3tPW ~* &* +@all",
		"user noget on >noget-s3cr3tPW ~* &* +@all -get",
	}})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: "perm", Shards: 4})
	url := func(userinfo, db string) string {
		return "redis://" + userinfo + srv.Addr() + "/" + db
	}
	cases := []struct{ name, url, want, cliWant string }{
		{"db out of range", url("default:def-s3cr3tPW@", "99"), "ERR DB index is out of range", ""},
		{"wrong password", url("default:wrong-s3cr3tPW@", "0"), "WRONGPASS", ""},
		{"no password", url("", "0"), "NOAUTH", ""},
		{"user without GET", url("noget:noget-s3cr3tPW@", "0"), "NOPERM", ""},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			env := h.env()
			env["DISPATCHER_REDIS_URL"] = c.url
			p := start(t, env)
			code := p.wait(15 * time.Second)
			out := strings.TrimSpace(p.out.String())
			if code != 2 || strings.Count(out, "\n") != 0 || !strings.Contains(out, c.want) || !strings.Contains(out, "DISPATCHER_REDIS_URL") {
				t.Errorf("exit %d, output %q: want exit 2 and one line naming DISPATCHER_REDIS_URL and %q", code, out, c.want)
			}
			stdout, stderr, code := runCLI(t, env, "stats")
			stderr = strings.TrimSpace(stderr)
			if c.cliWant == "" {
				c.cliWant = c.want
			}
			if code != 2 || strings.Count(stderr, "\n") != 0 || !strings.Contains(stderr, c.cliWant) {
				t.Errorf("stats: exit %d, stderr %q, stdout %q: want exit 2 and one line with %q", code, stderr, stdout, c.cliWant)
			}
			if strings.Contains(out+stderr+stdout, "s3cr3tPW") {
				t.Errorf("a password is shown: %q %q", out, stderr)
			}
		})
	}
}

// TestRedisOutageLogged: a Redis that goes away and comes back is logged
// once each way, for the whole process (not per queue or shard), the
// second line with how long it was out.
func TestRedisOutageLogged(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: "out1", Shards: 8}, queueSpec{Name: "out2", Shards: 8})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	p := h.start()
	waitLogged(t, p, "dispatching", 15*time.Second)
	time.Sleep(500 * time.Millisecond)
	srv.Kill()
	waitLogged(t, p, "lost Redis", 10*time.Second)
	time.Sleep(2 * time.Second)
	srv.Restart()
	srv.WaitLoaded(10 * time.Second)
	waitLogged(t, p, "Redis is back", 15*time.Second)
	time.Sleep(time.Second)
	out := p.out.String()
	if n := strings.Count(out, "lost Redis"); n != 1 {
		t.Errorf("%d lines say Redis was lost, want 1", n)
	}
	if n := strings.Count(out, "Redis is back"); n != 1 {
		t.Errorf("%d lines say Redis is back, want 1", n)
	}
	back := grep(out, "Redis is back")
	if !strings.Contains(back, "down_for=") {
		t.Errorf("the line does not say how long Redis was out: %q", back)
	}
}
