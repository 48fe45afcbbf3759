// Command dispatcher moves due tasks from sharded Redis sorted sets to a
// RabbitMQ exchange. main only wires the parts together: the daemon
// (daemon.go) and the commands (cli_*.go, registered in cli_root.go).
package main

import (
	"io"
	"os"
)

func main() { os.Exit(runWith(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1 // could not start (e.g. shard count mismatch)
	exitSettings = 2 // bad settings or arguments
)

// run is runWith without stdin.
func run(args []string, stdout, stderr io.Writer) int {
	return runWith(args, os.Stdin, stdout, stderr)
}
