// Command check decodes Kubernetes manifests strictly into their API
// types and checks what a dispatcher Deployment must have (see
// docs/operations.md#kubernetes and scripts/chart-check.sh, which runs it
// on the chart's renders and the KEDA example).
//
//	check [-out DIR] FILE...   (FILE - reads stdin)
//
// Every document of the files must be a kind it knows (decode.go), with no
// field its type lacks; the objects of all files are then checked together
// (rules.go). With -out, what the objects hold is written to DIR for other
// tools (out.go): each Deployment's dispatcher environment, ConfigMap data,
// PrometheusRule groups as a rules file. Exit
// status 0 when all is well, 1 with a line per problem otherwise, 2 for a
// bad argument.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	outDir := fs.String("out", "", "write env files, ConfigMap data and rules files to `DIR`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "check: name the manifest files (- for stdin)")
		return 2
	}
	var objs []object
	var errs []error
	for _, name := range fs.Args() {
		var data []byte
		var err error
		if name == "-" {
			data, err = io.ReadAll(stdin)
		} else {
			data, err = os.ReadFile(name)
		}
		if err != nil {
			fmt.Fprintf(stderr, "check: %v\n", err)
			return 2
		}
		o, e := decodeAll(data, name)
		objs, errs = append(objs, o...), append(errs, e...)
	}
	errs = append(errs, checkAll(objs)...)
	if *outDir != "" && len(errs) == 0 {
		if err := writeOut(objs, *outDir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, err := range errs {
		fmt.Fprintf(stderr, "check: %v\n", err)
	}
	if len(errs) > 0 {
		return 1
	}
	count := map[string]int{}
	for _, o := range objs {
		count[o.Kind]++
	}
	var kinds []string
	for k, n := range count {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	fmt.Fprintf(stdout, "ok: %d objects (%s)\n", len(objs), strings.Join(kinds, ", "))
	return 0
}
