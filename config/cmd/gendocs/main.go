// Command gendocs writes the settings reference (docs/reference/settings.md)
// from the configuration code, the source of --help:
//
//	go generate ./config/
//
// config's TestSettingsReferenceUpToDate fails while the file differs.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/dispatcher/dispatcher/config"
)

func main() {
	out := flag.String("o", "", "file to write (default: standard output)")
	flag.Parse()
	var b bytes.Buffer
	if err := config.WriteReference(&b); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
	if *out == "" {
		os.Stdout.Write(b.Bytes())
		return
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
}
