package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The documents whose relative links TestDocLinksResolve follows.
var docRoots = []string{"../README.md", "../CONTRACT.md", "../CHANGELOG.md", "../docs", "../deploy", "../examples"}

var (
	// [text](target) and ![alt](target), with an optional "title".
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// [label]: target
	refLink     = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	heading     = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlAnchor  = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	codeSpan    = regexp.MustCompile("`+[^`]*`+")
	mdLinkInner = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// TestDocLinksResolve: every relative link in the README, CONTRACT.md,
// CHANGELOG.md and the Markdown under docs/, deploy/ and examples/ names a
// file that exists, and its #anchor, in a Markdown file, one of that
// file's headings (as GitHub spells them) or <a id> anchors. A renamed
// heading or moved file otherwise leaves a dead link behind
// (docs/testing.md pointed at producers.md#java-jedis-lz4-java after the
// heading became "Java (lz4-java)").
func TestDocLinksResolve(t *testing.T) {
	var files []string
	for _, root := range docRoots {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Name() == "node_modules" { // npm's (examples/ingress/node), not ours
				return filepath.SkipDir
			}
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	anchors := map[string]map[string]bool{} // file -> its anchors
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchors[path] = mdAnchors(string(b))
		return anchors[path]
	}
	links := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range mdLinks(string(b)) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s:%d: link to %q: no such file", file, l.line, l.target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			if !anchorsOf(target)[anchor] {
				t.Errorf("%s:%d: link to %q: %s has no heading or anchor %q", file, l.line, l.target, target, anchor)
			}
		}
	}
	if links < 20 {
		t.Fatalf("only %d relative links found in %d files: the parser is broken", links, len(files))
	}
	t.Logf("%d relative links checked in %d files", links, len(files))
}

type mdLink struct {
	target string
	line   int
}

// mdLinks lists the link targets of a Markdown text outside code blocks
// and code spans.
func mdLinks(text string) []mdLink {
	var out []mdLink
	inFence := false
	for n, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, mdLink{m[1], n + 1})
		}
		for _, m := range refLink.FindAllStringSubmatch(line, -1) {
			out = append(out, mdLink{m[1], n + 1})
		}
	}
	return out
}

// mdAnchors are the anchors GitHub gives a Markdown text's headings, and
// its <a id="..."> anchors.
func mdAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := githubSlug(m[2])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// githubSlug is GitHub's anchor of a heading: the text without its
// Markdown (links keep their text, code spans their content), lowercase,
// every character but letters, digits, '-', '_' and spaces dropped, spaces
// made '-'.
func githubSlug(h string) string {
	h = mdLinkInner.ReplaceAllString(h, "$1")
	h = strings.NewReplacer("`", "", "*", "", "<", "", ">", "").Replace(h)
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func TestGithubSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Java (lz4-java)": "java-lz4-java",
		"Seeing the queues: metrics, stall watchdog, `dispatcher stats`, status page": "seeing-the-queues-metrics-stall-watchdog-dispatcher-stats-status-page",
		"Waking the dispatchers (extension)":                                          "waking-the-dispatchers-extension",
		"Steady traffic: claiming ahead":                                              "steady-traffic-claiming-ahead",
		"[Link](x.md) and *emphasis*":                                                 "link-and-emphasis",
	} {
		if got := githubSlug(h); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", h, got, want)
		}
	}
}
