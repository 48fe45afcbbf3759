package tests

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok {
				t.Errorf("%s: NewScript with a computed source: a script must be a constant", path)
				return true
			}
			src, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Errorf("%s: %v", path, err)
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
