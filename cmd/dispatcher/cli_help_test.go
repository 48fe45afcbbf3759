package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFlagsNameTheirValues: every flag that takes a value names it in
// --help (--catchup POLICY, --in DURATION), not by its Go type
// (--catchup string), in capitals as the other names are; "i", a shard's
// index, as the docs write it.
func TestFlagsNameTheirValues(t *testing.T) {
	types := map[string]bool{"string": true, "int": true, "int64": true, "uint": true, "float": true, "float64": true,
		"duration": true, "strings": true, "stringArray": true, "time": true, "key": true, "value": true}
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden || f.Value.Type() == "bool" {
				return
			}
			checked++
			name, _ := pflag.UnquoteUsage(f)
			if types[name] || name != strings.ToUpper(name) && name != "i" {
				t.Errorf("dispatcher %s --%s %s: name the value (e.g. DURATION, POLICY, N)", c.CommandPath()[len("dispatcher "):], f.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(streams{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}))
	if checked < 20 {
		t.Fatalf("only %d flags with values found: the walk missed the commands", checked)
	}
}
