package config

import (
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/dispatcher/dispatcher/internal/redact"
)

// Var describes one setting for --help, for the settings reference
// (docs/reference/settings.md) and for spotting unknown variables.
type Var struct {
	Key, Default, Desc string
	Required           bool
	// See is where the docs say more, a path from the repository root
	// with an optional #anchor (tag see).
	See string
}

// vars lists the settings of spec (a pointer to Settings or Queue); keys
// of Queue fields are prefixed with prefix + "_".
func vars(prefix string, spec any) []Var {
	t := reflect.TypeOf(spec).Elem()
	var out []Var
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := f.Tag.Get("envconfig")
		if key == "" {
			key = f.Tag.Get("env")
			if key == "" {
				continue
			}
			key = prefix + "_" + key
		}
		def := f.Tag.Get("default")
		if text := f.Tag.Get("defaultText"); text != "" { // derived from other settings
			def = text
		}
		out = append(out, Var{Key: key, Default: def, Desc: f.Tag.Get("desc"), See: f.Tag.Get("see"),
			Required: f.Tag.Get("required") == "true" || f.Tag.Get("required") == "daemon"})
	}
	return out
}

// QueueVarPrefix stands for a queue's variable prefix in --help and the
// settings reference.
const QueueVarPrefix = Prefix + "_QUEUE_<NAME>"

// Usage prints every variable with its default and meaning, in lines
// that fit an 80-column terminal.
func Usage(w io.Writer) {
	fmt.Fprintln(w, "Settings come from the environment:")
	print := func(vs []Var) {
		for _, v := range vs {
			def := v.Default
			switch {
			case v.Required:
				def = "required"
			case def == "":
				def = `default ""`
			default:
				def = "default " + redact.URL(def)
			}
			fmt.Fprintf(w, "\n%s (%s)\n", v.Key, def)
			desc := v.Desc
			if v.See != "" {
				file, _, _ := strings.Cut(v.See, "#") // anchors would overflow the line
				desc += " (see " + file + ")"
			}
			for _, l := range wrap(desc, 76) {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
	print(vars(Prefix, &Settings{}))
	print(vars(QueueVarPrefix, &Queue{}))
	fmt.Fprintln(w, "\n<NAME> is the queue name upper-cased, every character outside A-Z 0-9")
	fmt.Fprintln(w, "written as _.")
}

// wrap breaks s into lines of at most width bytes at spaces (a longer
// word gets a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
