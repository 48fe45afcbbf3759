package tests

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// documentedACL is the command list of docs/how-it-works.md's "Redis ACLs"
// section, lower-case, without the +.
func documentedACL(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../docs/how-it-works.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Redis ACLs\n")
	if !ok {
		t.Fatal(`docs/how-it-works.md has no "## Redis ACLs" section`)
	}
	_, list, ok := strings.Cut(sec, "the commands `")
	list, _, ok2 := strings.Cut(list, "`")
	if !ok || !ok2 {
		t.Fatal("the Redis ACLs section gives no command list (\"the commands `+...`\")")
	}
	out := map[string]bool{}
	for _, c := range strings.Fields(list) {
		out[strings.ToLower(strings.TrimPrefix(c, "+"))] = true
	}
	return out
}

var scriptCall = regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z]+)['"]`)

// TestDocumentedACLGrantsEveryScriptCall: the least-privilege ACL that the
// docs give grants every command a Lua script of the dispatcher or its
// CLI calls (Redis checks a script's calls against the user's ACL too, and
// refuses them with "can't run this command"), and it is exactly the list
// the TLS/ACL tests run the dispatcher with. A script that starts calling
// a new command fails this until the docs (and an upgrade note) grant it.
func TestDocumentedACLGrantsEveryScriptCall(t *testing.T) {
	doc := documentedACL(t)
	tested := map[string]bool{}
	for _, c := range strings.Fields(dispatcherCommands) {
		tested[strings.ToLower(strings.TrimPrefix(c, "+"))] = true
	}
	for c := range doc {
		if !tested[c] {
			t.Errorf("docs grant +%s, which TestRedisTLSAndACL's dispatcherCommands does not", c)
		}
	}
	for c := range tested {
		if !doc[c] {
			t.Errorf("TestRedisTLSAndACL grants +%s, which the docs' list does not", c)
		}
	}
	used := map[string][]string{} // command -> files
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "tests", "bench", "examples", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range scriptCall.FindAllStringSubmatch(string(b), -1) {
			c := strings.ToLower(m[1])
			used[c] = append(used[c], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(used) < 10 {
		t.Fatalf("found only %d commands in the scripts: the walk is wrong", len(used))
	}
	var missing []string
	for c, files := range used {
		if !doc[c] {
			sort.Strings(files)
			missing = append(missing, "+"+c+" ("+strings.Join(files[:1], "")+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("scripts call commands the documented ACL does not grant: %s", strings.Join(missing, ", "))
	}
}
