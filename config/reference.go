package config

import (
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ReferencePath is where the settings reference lives, from the
// repository root; `go generate ./config/` writes it.
const ReferencePath = "docs/reference/settings.md"

//go:generate go run ./cmd/gendocs -o ../docs/reference/settings.md

// referenceIntro opens the settings reference; the rest is generated from
// the struct tags that --help prints.
const referenceIntro = `# Settings reference

<!-- Generated from config/config.go by ` + "`go generate ./config/`" + `: do not edit by hand.
config's TestSettingsReferenceUpToDate fails when this file and the code differ. -->

Every setting comes from the environment; ` + "`dispatcher --help`" + ` prints this list from the same
source. Most deployments set only the five in the [README](../../README.md#settings); the rest have
defaults that fit.

- A ` + "`DISPATCHER_*`" + ` variable the dispatcher does not know (a typo, or a queue missing from
  ` + "`DISPATCHER_QUEUES`" + `) is an error.
- Bad settings are found before anything connects: the process exits with code 2 after one line on
  stderr naming the variable and its value ([examples](../operations.md#start-checks)).
- Durations use Go syntax: ` + "`500ms`, `30s`, `2m`" + `.
- The commands (` + "`dispatcher schedule`, `stats`, ..." + `) need only ` + "`DISPATCHER_REDIS_URL`" + ` (and
  ` + "`DISPATCHER_KEY_PREFIX`" + ` if not ` + "`dq`" + `): they read a queue's shard count from Redis.
`

// WriteReference writes the settings reference (ReferencePath) in
// Markdown: every variable of --help with its default, its meaning and
// where the docs say more.
func WriteReference(w io.Writer) error {
	var b strings.Builder
	b.WriteString(referenceIntro)
	instance, queue := vars(Prefix, &Settings{}), vars(QueueVarPrefix, &Queue{})

	b.WriteString("\n| variable | default |\n| --- | --- |\n")
	for _, v := range append(instance[:len(instance):len(instance)], queue...) {
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s |\n", v.Key, slug(v.Key), referenceDefault(v))
	}

	section := func(vs []Var) {
		for _, v := range vs {
			fmt.Fprintf(&b, "\n### `%s`\n\n", v.Key)
			fmt.Fprintf(&b, "Default: %s.\n\n", referenceDefault(v))
			b.WriteString(capitalize(markdownText(v.Desc)))
			b.WriteString(".\n")
			if v.See != "" {
				file, anchor, _ := strings.Cut(v.See, "#")
				link := relativeTo(path.Dir(ReferencePath), file)
				if anchor != "" {
					link += "#" + anchor
				}
				fmt.Fprintf(&b, "\nMore: [%s](%s).\n", v.See, link)
			}
		}
	}
	b.WriteString("\n## Instance settings\n")
	section(instance)
	b.WriteString("\n## Per-queue settings\n\n")
	b.WriteString("`<NAME>` is the queue name upper-cased, every character outside `A-Z 0-9` written as `_`\n")
	b.WriteString("(queue `orders.eu-1` → `DISPATCHER_QUEUE_ORDERS_EU_1_SHARDS`). Each queue of\n")
	b.WriteString("`DISPATCHER_QUEUES` has its own.\n")
	section(queue)
	_, err := io.WriteString(w, b.String())
	return err
}

func referenceDefault(v Var) string {
	switch {
	case v.Required && v.Key == Prefix+"_QUEUES":
		return "required by the daemon"
	case v.Required:
		return "required"
	case v.Default == "":
		return "empty"
	case strings.Contains(v.Default, " "): // a rule, such as "LEASE/3, at most 10s"
		return markdownText(v.Default)
	default:
		return "`" + v.Default + "`"
	}
}

// slug is GitHub's anchor of a heading holding only the code span key.
func slug(key string) string {
	return strings.ToLower(strings.NewReplacer("<", "", ">", "").Replace(key))
}

// relativeTo is the path of file (from the repository root) as seen from
// directory dir (also from the root).
func relativeTo(dir, file string) string {
	rel, err := filepath.Rel(filepath.FromSlash(dir), filepath.FromSlash(file))
	if err != nil { // both are relative to the root: cannot happen
		return file
	}
	return filepath.ToSlash(rel)
}

// markdownText turns a plain-text description into Markdown: words that
// are names, URLs, keys or values (they hold one of _ < > * { } / = + ? :
// inside) become code spans, so nothing in them is read as markup.
func markdownText(s string) string {
	words := strings.Fields(s)
	for i, w := range words {
		core := strings.TrimLeft(w, "(")
		lead := w[:len(w)-len(core)]
		core = strings.TrimRight(core, ",;:)")
		tail := w[len(lead)+len(core):]
		if strings.ContainsAny(core, "_<>*{}/=+?:") {
			words[i] = lead + "`" + core + "`" + tail
		}
	}
	return strings.Join(words, " ")
}

// capitalize makes a description, written to follow a variable's name in
// --help, start a paragraph.
func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if !unicode.IsLower(r) {
		return s
	}
	return string(unicode.ToUpper(r)) + s[n:]
}
