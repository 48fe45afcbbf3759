package shard_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDependingIsLight: a program that imports shard, as a producer does,
// gets the shard module, go-redis and xxhash in its go.mod and nothing
// but what go-redis itself requires; go mod tidy asks for nothing more
// when run again. The daemon's dependencies (broker client, CLI, metrics,
// test containers, browser) must never reach a producer.
func TestDependingIsLight(t *testing.T) {
	shardDir, err := filepath.Abs(".") // the shard module's root: the package's directory
	if err != nil {
		t.Fatal(err)
	}
	dir, redisOnly := t.TempDir(), t.TempDir()
	write := func(dir, name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(dir, "go.mod", "module example.com/producer\n\ngo 1.26.0\n\n"+
		"require github.com/dispatcher/dispatcher/shard v0.0.0-00010101000000-000000000000\n\n"+
		"replace github.com/dispatcher/dispatcher/shard => "+shardDir+"\n")
	write(dir, "main.go", `package main

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

func main() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	p, err := shard.NewProducer(rdb, "dq", "orders", 16)
	if err != nil {
		panic(err)
	}
	if err := p.Schedule(context.Background(), []byte("x"), time.Now().Add(time.Minute)); err != nil {
		panic(err)
	}
}
`)
	goIn := func(dir string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// -mod=mod lets tidy write; GOWORK=off keeps a workspace out.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out
	}
	goCmd := func(args ...string) []byte { t.Helper(); return goIn(dir, args...) }
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	type modFile struct {
		Require []struct {
			Path, Version string
		}
	}
	requires := func(goMod string) modFile {
		t.Helper()
		var f modFile
		if err := json.Unmarshal(goCmd("mod", "edit", "-json", goMod), &f); err != nil {
			t.Fatalf("go mod edit -json %s: %v", goMod, err)
		}
		return f
	}

	goCmd("mod", "tidy")
	goMod, goSum := read("go.mod"), read("go.sum")
	goCmd("build", "-o", os.DevNull, ".")

	// What go-redis itself requires is fine: read from its own go.mod.
	var redisMod struct{ Version, GoMod string }
	if err := json.Unmarshal(goCmd("list", "-m", "-json", "github.com/redis/go-redis/v9"), &redisMod); err != nil || redisMod.GoMod == "" {
		t.Fatalf("go-redis's go.mod not found: %v", err)
	}
	redisVersion := "github.com/redis/go-redis/v9 " + redisMod.Version
	allowed := []string{"github.com/dispatcher/dispatcher/shard", "github.com/redis/go-redis/v9", "github.com/cespare/xxhash/v2"}
	for _, r := range requires(redisMod.GoMod).Require {
		allowed = append(allowed, r.Path)
	}
	var listed []string
	for _, r := range requires("go.mod").Require {
		listed = append(listed, r.Path)
		if !slices.Contains(allowed, r.Path) {
			t.Errorf("a producer's go.mod requires %s %s: only the shard module, go-redis, xxhash and go-redis's own requirements %v may appear", r.Path, r.Version, allowed[3:])
		}
	}
	for _, want := range allowed[:2] {
		if !slices.Contains(listed, want) {
			t.Errorf("a producer's go.mod does not require %s", want)
		}
	}
	// The daemon's heavy dependencies, by name, in go.mod or go.sum.
	for _, heavy := range []string{"testcontainers", "chromedp", "spf13/cobra", "prometheus", "zerolog",
		"amqp091", "toxiproxy", "goleak", "envconfig", "robfig/cron"} {
		if strings.Contains(goMod, heavy) || strings.Contains(goSum, heavy) {
			t.Errorf("a producer's go.mod or go.sum names %s", heavy)
		}
	}
	// Every module of the build, and of the whole module graph a
	// producer's go command loads, is one of those.
	for _, m := range strings.Fields(string(goCmd("list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "."))) {
		if m != "example.com/producer" && !slices.Contains(allowed, m) {
			t.Errorf("a producer's build includes module %s", m)
		}
	}
	// The graph: that of a program importing go-redis alone (at the same
	// version), plus the shard module and xxhash.
	write(redisOnly, "go.mod", "module example.com/redisonly\n\ngo 1.26.0\n\nrequire "+redisVersion+"\n")
	write(redisOnly, "main.go", "package main\n\nimport \"github.com/redis/go-redis/v9\"\n\nfunc main() { _ = redis.NewClient(&redis.Options{}) }\n")
	goIn(redisOnly, "mod", "tidy")
	graph := strings.Fields(string(goIn(redisOnly, "list", "-m", "-f", "{{.Path}}", "all")))
	graph = append(graph, allowed[:3]...)
	for _, m := range strings.Fields(string(goCmd("list", "-m", "-f", "{{.Path}}", "all"))) {
		if m != "example.com/producer" && !slices.Contains(graph, m) {
			t.Errorf("a producer's module graph includes %s, which a program importing go-redis alone does not have", m)
		}
	}

	goCmd("mod", "tidy")
	if read("go.mod") != goMod || read("go.sum") != goSum {
		t.Errorf("a second go mod tidy changed the producer's module:\ngo.mod before:\n%s\nafter:\n%s", goMod, read("go.mod"))
	}
	t.Logf("a producer's go.mod requires %v", listed)
}
