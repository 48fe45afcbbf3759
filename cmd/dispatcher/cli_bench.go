package main

import (
	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/bench"
)

// newBenchCmd is `dispatcher bench`, whose options package bench parses
// (Go flag syntax: -rates 1000,2000).
func newBenchCmd(s streams) *cobra.Command {
	return &cobra.Command{
		Use:                "bench [options]",
		Short:              "measure throughput, lateness and cost (see bench -h)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := bench.Main(args, s.stdout, s.stderr); code != exitOK {
				return exitCode(code)
			}
			return nil
		},
	}
}
