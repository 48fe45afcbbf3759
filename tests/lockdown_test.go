package tests

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// httpClient talks to the dispatcher's endpoint; no keep-alive, so no
// connection outlives a request.
var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// httpGet returns the body of a GET, or an error (any status but 200 too).
func httpGet(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// luaMembers are members written to be run if a script ever evaluated its
// input: Lua code, long-bracket and quote breakouts, format directives, a
// NUL, and a raw Redis protocol command. pwned is a key the code would set.
func luaMembers(pwned string) [][]byte {
	set := fmt.Sprintf(`redis.call('SET', '%s', '1')`, pwned)
	ss := []string{
		`redis.call('FLUSHALL')`,
		`return redis.call('FLUSHALL')`,
		set,
		`]] ` + set + ` --[[`,
		`]==] ` + set + ` --`,
		`'); ` + set + `; --`,
		`"); ` + set + `; --`,
		`loadstring("` + set + `")()`,
		`load("` + set + `")()`,
		`assert(loadstring(ARGV[1]))()`,
		`dofile('/etc/passwd')`,
		`os.exit(1)`,
		`while true do end`,
		`string.rep('x', 1e10)`,
		`redis.breakpoint()`,
		`cjson.decode('{"a":')`,
		`KEYS[1]`, `ARGV[1]`, `#ARGV`, `...`,
		`%d:%s%n%%%q`,
		"\x00" + set,
		set + "\x00",
		"\x00]]\x00",
		"*3\r\n$3\r\nSET\r\n$" + fmt.Sprint(len(pwned)) + "\r\n" + pwned + "\r\n$1\r\n1\r\n",
		"FLUSHALL",
		"SET " + pwned + " 1",
	}
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

// TestLuaNeverEvaluatesMembers schedules members that are Lua and Redis
// code: each is delivered unchanged, and nothing else in Redis changes (a
// canary key keeps its value, the key the code would set never appears,
// the shards end empty).
func TestLuaNeverEvaluatesMembers(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "lua", Shards: 4})
	ctx := context.Background()
	canary, pwned := h.prefix+":canary", h.prefix+":pwned"
	if err := h.rdb.Set(ctx, canary, "intact", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rec := h.record("lua")
	h.start()
	due := time.Now().Add(300 * time.Millisecond)
	members := luaMembers(pwned)
	body := map[string][]byte{}
	for _, m := range members {
		body[shard.MessageID(m, due.UnixMilli())] = m
	}
	want := scheduleAt(t, h.producer("lua"), due, members...)
	h.verify("lua", want, 20*time.Second, 0)
	checkDeliveries(t, rec.all(), body, due.UnixMilli())
	if v, err := h.rdb.Get(ctx, canary).Result(); err != nil || v != "intact" {
		t.Errorf("canary key %s = %q, %v; want \"intact\"", canary, v, err)
	}
	if n := h.rdb.Exists(ctx, pwned).Val(); n != 0 {
		t.Errorf("key %s exists: a member was run as code", pwned)
	}
	eventually(t, 5*time.Second, "the shards to empty", func() bool {
		p, f, d := h.leftovers(h.queues[0])
		return p+f+d == 0
	})
}

// constString is the value of a string constant expression made of
// literals, constants declared with a literal value in the same file, and
// +; ok is false for anything computed at run time.
func constString(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, okA := constString(e.X)
		b, okB := constString(e.Y)
		return a + b, okA && okB
	case *ast.ParenExpr:
		return constString(e.X)
	case *ast.Ident:
		if e.Obj == nil || e.Obj.Kind != ast.Con {
			return "", false
		}
		spec, ok := e.Obj.Decl.(*ast.ValueSpec)
		if !ok || len(spec.Values) != 1 {
			return "", false
		}
		return constString(spec.Values[0])
	}
	return "", false
}

// TestScriptsHaveNoDynamicCode reads every Lua script of the daemon (each
// redis.NewScript literal in the non-test Go files) and fails if one could
// turn data into code: loadstring, load, dofile, loadfile, setfenv,
// string.dump, or a nested EVAL.
func TestScriptsHaveNoDynamicCode(t *testing.T) {
	forbidden := regexp.MustCompile(`(?i)\b(loadstring|load|dofile|loadfile|setfenv|getfenv)\s*\(|string\.dump|['"]eval(sha)?(_ro)?['"]`)
	scripts := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "..") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "NewScript" || len(call.Args) != 1 {
				return true
			}
			src, ok := constString(call.Args[0])
			if !ok {
				t.Errorf("%s: NewScript with a computed source: a script must be a constant", path)
				return true
			}
			scripts++
			if m := forbidden.FindString(src); m != "" {
				t.Errorf("%s: script uses %q, which can run data as code:\n%s", path, m, src)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Lua scripts checked", scripts)
	if scripts < 4 {
		t.Fatalf("found only %d scripts; the search is broken", scripts)
	}
}

// externalIPv4 is an address of this machine outside loopback, or "".
func externalIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

// TestHTTPBindsLoopbackUnlessTold: DISPATCHER_HTTP_ADDR with a port only
// binds 127.0.0.1 (and says so); an explicit host is used as given, so
// 0.0.0.0 and [::] serve every interface, 127.0.0.2 only itself, and an
// address the machine does not have fails the start, naming the variable.
func TestHTTPBindsLoopbackUnlessTold(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "bind", Shards: 1})
	ext := externalIPv4()
	t.Logf("non-loopback address of this machine: %q", ext)
	freePort := func() string {
		_, p, _ := net.SplitHostPort(testenv.FreeAddr(t))
		return p
	}
	serve := func(t *testing.T, addr string) *proc {
		env := h.env()
		env["DISPATCHER_HTTP_ADDR"] = addr
		p := start(t, env)
		eventually(t, 20*time.Second, "the endpoint to start", func() bool {
			return strings.Contains(p.out.String(), "serving /healthz") || !p.running()
		})
		return p
	}
	reaches := func(hostPort string) bool {
		_, err := httpGet("http://" + hostPort + "/healthz")
		return err == nil
	}
	expect := func(t *testing.T, hostPort string, want bool) {
		t.Helper()
		if got := reaches(hostPort); got != want {
			t.Errorf("GET http://%s/healthz answered: %v, want %v", hostPort, got, want)
		}
	}

	t.Run("port only", func(t *testing.T) {
		port := freePort()
		p := serve(t, ":"+port)
		out := p.out.String()
		if !strings.Contains(out, "addr=127.0.0.1:"+port) || !strings.Contains(out, "serving on 127.0.0.1 only") {
			t.Fatalf("log does not say it serves on 127.0.0.1 only:\n%s", out)
		}
		expect(t, "127.0.0.1:"+port, true)
		expect(t, "[::1]:"+port, false)
		if ext != "" {
			expect(t, ext+":"+port, false)
		}
	})
	t.Run("0.0.0.0", func(t *testing.T) {
		port := freePort()
		p := serve(t, "0.0.0.0:"+port)
		if out := p.out.String(); !strings.Contains(out, "addr=0.0.0.0:"+port) || strings.Contains(out, "127.0.0.1 only") {
			t.Fatalf("log:\n%s", out)
		}
		expect(t, "127.0.0.1:"+port, true)
		expect(t, "[::1]:"+port, false) // IPv4 only, as written
		if ext != "" {
			expect(t, ext+":"+port, true)
		}
	})
	t.Run("[::]", func(t *testing.T) {
		port := freePort()
		p := serve(t, "[::]:"+port)
		if out := p.out.String(); !strings.Contains(out, "addr=[::]:"+port) {
			t.Fatalf("log:\n%s", out)
		}
		expect(t, "[::1]:"+port, true)
		if ext != "" {
			expect(t, ext+":"+port, true) // every interface
		}
	})
	t.Run("127.0.0.2", func(t *testing.T) {
		port := freePort()
		serve(t, "127.0.0.2:"+port)
		expect(t, "127.0.0.2:"+port, true)
		expect(t, "127.0.0.1:"+port, false)
	})
	t.Run("address not on this machine", func(t *testing.T) {
		port := freePort()
		p := serve(t, "10.1.2.3:"+port)
		if code := p.wait(10 * time.Second); code != 1 {
			t.Fatalf("exit code %d, want 1", code)
		}
		out := p.out.String()
		if !strings.Contains(out, "DISPATCHER_HTTP_ADDR=10.1.2.3:"+port) || !strings.Contains(out, "cannot assign requested address") {
			t.Fatalf("output does not name the variable and the reason:\n%s", out)
		}
	})
}

// keyLines are the base64 lines of a PEM private key file: none may ever
// appear in any output.
func keyLines(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); len(l) >= 16 && !strings.HasPrefix(l, "-----") {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no key material in %s", file)
	}
	return out
}

// TestSecretsNeverShown runs the dispatcher against a private Redis (ACL
// user with a password, TLS with a client certificate) and a private
// RabbitMQ node (amqps, own user and password, client certificate), at
// debug level. It delivers, and neither password nor any line of either
// private key appears in its logs, /metrics, /readyz or /healthz; nor in
// --help, the error of a bad setting, or the logs, /metrics and /readyz of
// runs with a wrong password (text and JSON logs). Key file paths may show.
func TestSecretsNeverShown(t *testing.T) {
	const redisPW, amqpPW = "RedisPW-s3cr3t-7f1", "AmqpPW-s3cr3t-9c2"
	certs := testenv.NewCerts(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{TLS: &certs, TLSAuthClients: true,
		Users: []string{"user app on >" + redisPW + " ~* &* +@all"}})
	node := testenv.PrivateRabbit(t)
	node.AddUser(t, "app", amqpPW)
	secrets := append([]string{redisPW, amqpPW}, keyLines(t, certs.ClientKey)...)
	secrets = append(secrets, keyLines(t, node.Certs.ClientKey)...)
	leaks := func(what, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s shows the secret %q:\n%s", what, s, tail(text, 3000))
				return
			}
		}
	}

	h := newHarness(t)
	q := queueSpec{Name: "secret", Shards: 2, Exchange: h.prefix + ".secret", RoutingKey: "secret"}
	h.queues = []queueSpec{q}
	h.rdb = srv.Client()
	conn, err := node.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h.got[q.Name] = testenv.Consumer(t, conn, q.Exchange, q.RoutingKey)
	addr := testenv.FreeAddr(t)
	for k, v := range map[string]string{
		"DISPATCHER_REDIS_URL":       srv.URLFor("app", redisPW),
		"DISPATCHER_REDIS_CA_FILE":   certs.CA,
		"DISPATCHER_REDIS_CERT_FILE": certs.ClientCert,
		"DISPATCHER_REDIS_KEY_FILE":  certs.ClientKey,
		"DISPATCHER_AMQP_URL":        node.AMQPSURL("app", amqpPW),
		"DISPATCHER_AMQP_CA_FILE":    node.Certs.CA,
		"DISPATCHER_AMQP_CERT_FILE":  node.Certs.ClientCert,
		"DISPATCHER_AMQP_KEY_FILE":   node.Certs.ClientKey,
		"DISPATCHER_HTTP_ADDR":       addr,
		"DISPATCHER_LOG_LEVEL":       "debug",
	} {
		h.extra[k] = v
	}
	if !strings.HasPrefix(h.env()["DISPATCHER_REDIS_URL"], "rediss://") {
		t.Fatalf("private Redis is not TLS: %s", h.env()["DISPATCHER_REDIS_URL"])
	}

	p := h.start()
	want := scheduleSpread(t, h.producer(q.Name), "s", 200, time.Now().Add(300*time.Millisecond), 200*time.Millisecond)
	h.verify(q.Name, want, 30*time.Second, 0)
	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		body, err := httpGet("http://" + addr + path)
		if err != nil {
			t.Fatalf("%s: %v %s", path, err, body)
		}
		leaks(path, body)
	}
	if !strings.Contains(p.out.String(), "app:xxxxx@") {
		t.Errorf("log does not show the redacted URLs:\n%s", tail(p.out.String(), 2000))
	}
	leaks("log", p.out.String())

	// --help and a bad setting, with the same environment.
	help := exec.Command(binary, "--help")
	for k, v := range h.env() {
		help.Env = append(help.Env, k+"="+v)
	}
	out, err := help.CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	leaks("--help", string(out))
	for _, bad := range []map[string]string{
		{"DISPATCHER_LEASE": "soon"},
		{"DISPATCHER_REDIS_KEY_FILE": certs.ClientCert}, // a certificate where the key belongs
		{"DISPATCHER_AMQP_KEY_FILE": certs.ClientKey},   // a key of another certificate
	} {
		env := h.env()
		for k, v := range bad {
			env[k] = v
		}
		bp := start(t, env)
		if code := bp.wait(10 * time.Second); code != 2 {
			t.Errorf("%v: exit code %d, want 2:\n%s", bad, code, bp.out.String())
		}
		t.Logf("%v: %s", bad, strings.TrimSpace(bp.out.String()))
		leaks(fmt.Sprintf("error for %v", bad), bp.out.String())
	}

	// Wrong passwords: the failures are logged, the secrets are not.
	env := h.env()
	env["DISPATCHER_AMQP_URL"] = node.AMQPSURL("app", "Wrong"+amqpPW)
	env["DISPATCHER_LOG_FORMAT"] = "json"
	secrets = append(secrets, "Wrong"+amqpPW, "Wrong"+redisPW)
	env["DISPATCHER_HTTP_ADDR"] = testenv.FreeAddr(t)
	wa := start(t, env)
	eventually(t, 20*time.Second, "broker login failure logged", func() bool {
		return strings.Contains(wa.out.String(), "broker connect failed")
	})
	for _, path := range []string{"/metrics", "/readyz"} {
		body, _ := httpGet("http://" + env["DISPATCHER_HTTP_ADDR"] + path)
		if body == "" {
			t.Errorf("%s of the run with a wrong broker password: empty", path)
		}
		leaks(path+" (wrong broker password)", body)
	}
	leaks("log (wrong broker password)", wa.out.String())
	env = h.env()
	env["DISPATCHER_REDIS_URL"] = srv.URLFor("app", "Wrong"+redisPW)
	env["DISPATCHER_HTTP_ADDR"] = testenv.FreeAddr(t) // served before Redis is asked
	wr := start(t, env)
	if code := wr.wait(20 * time.Second); code != 2 || !strings.Contains(wr.out.String(), "WRONGPASS") {
		t.Errorf("wrong Redis password: exit %d, want 2 with WRONGPASS:\n%s", code, wr.out.String())
	}
	leaks("log (wrong Redis password)", wr.out.String())
}
