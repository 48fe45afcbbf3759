package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dispatcher/dispatcher/config"
)

// streams are a command's standard input and outputs.
type streams struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// commands are the subcommands of dispatcher (--help lists them by
// name). A new command is a file cli_<name>.go whose constructor is added
// here: it parses its flags with cobra and returns usageErrorf, failure or
// settingsError, which runWith turns into one line on stderr and the exit
// code.
var commands = []func(streams) *cobra.Command{
	newScheduleCmd,
	newCancelCmd,
	newRescheduleCmd,
	newShowCmd,
	newTailCmd,
	newStatsCmd,
	newListCmd,
	newDeadCmd,
	newPauseCmd,
	newResumeCmd,
	newReshardCmd,
	newRecurringCmd,
	newBenchCmd,
}

// exitError ends a command with an exit code. With err, run prints
// "<command path>: <err>" on one line, adding where to find help when
// usage is set; without, the command said what went wrong already.
type exitError struct {
	code  int
	err   error
	usage bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is a bad argument: exit 2, pointing at --help.
func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitSettings, err: fmt.Errorf(format, args...), usage: true}
}

// settingsError is a bad setting: exit 2.
func settingsError(err error) error { return &exitError{code: exitSettings, err: err} }

// failure is an operation that failed (Redis, the broker): exit 1.
func failure(err error) error { return &exitError{code: exitFailure, err: err} }

// exitCode ends with code, the command having said why.
func exitCode(code int) error { return &exitError{code: code} }

// newRootCmd is `dispatcher`: without arguments the daemon, otherwise one
// of commands.
func newRootCmd(s streams) *cobra.Command {
	root := &cobra.Command{
		Use:   "dispatcher",
		Short: "moves due tasks from sharded Redis sorted sets to RabbitMQ",
		// Anything but a command is a mistake; cobra would list
		// suggestions over several lines.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &exitError{code: exitSettings, err: fmt.Errorf("unknown argument %q (see dispatcher --help)", args[0])}
			}
			return nil
		},
		Version: version(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := runDaemon(s.stderr); code != exitOK {
				return exitCode(code)
			}
			return nil
		},
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.SetIn(s.stdin)
	root.SetOut(s.stdout)
	root.SetErr(s.stderr)
	root.SetVersionTemplate("dispatcher {{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &exitError{code: exitSettings, err: flagError(err), usage: true}
	})
	for _, c := range commands {
		root.AddCommand(c(s))
	}
	var noFlagsInUse func(*cobra.Command)
	noFlagsInUse = func(c *cobra.Command) { // each Use line names its flags
		c.DisableFlagsInUseLine = true
		for _, sub := range c.Commands() {
			noFlagsInUse(sub)
		}
	}
	noFlagsInUse(root)
	root.SetUsageFunc(usage)
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		if cmd != root {
			defaultHelp(cmd, args)
			return
		}
		rootHelp(cmd.OutOrStdout(), root)
	})
	return root
}

// flagError words pflag's errors as the commands did before they used it,
// for scripts matching them.
func flagError(err error) error {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "unknown flag: "); ok {
		return errors.New("flag provided but not defined: " + rest)
	}
	if rest, ok := strings.CutPrefix(msg, "unknown shorthand flag: "); ok {
		return errors.New("flag provided but not defined: " + rest)
	}
	return err
}

// rootHelp is `dispatcher --help`: the commands, then every setting.
func rootHelp(w io.Writer, root *cobra.Command) {
	fmt.Fprintln(w, "dispatcher moves due tasks from sharded Redis sorted sets to RabbitMQ.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage:")
	fmt.Fprintln(w, "  dispatcher              run until SIGTERM or SIGINT (settings below)")
	fmt.Fprintln(w, "  dispatcher COMMAND ...  see dispatcher COMMAND --help")
	fmt.Fprintln(w, "  dispatcher --version    print the version")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands (they need only DISPATCHER_REDIS_URL; tail the broker's URL):")
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() && c.Name() != "help" {
			fmt.Fprintf(w, "  %-10s %s\n", c.Name(), c.Short)
		}
	}
	fmt.Fprintln(w)
	config.Usage(w)
}

// usage is cobra's usage text of a command, its flags wrapped to fit 80
// columns.
func usage(c *cobra.Command) error {
	w := c.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "  %s COMMAND\n\nCommands:\n", c.CommandPath())
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-*s %s\n", sub.NamePadding(), sub.Name(), sub.Short)
			}
		}
	}
	if c.HasExample() {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	if c.HasAvailableLocalFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", c.LocalFlags().FlagUsagesWrapped(80))
	}
	if c.HasAvailableInheritedFlags() {
		fmt.Fprintf(w, "\nGlobal flags:\n%s", c.InheritedFlags().FlagUsagesWrapped(80))
	}
	return nil
}

// runWith runs dispatcher with args and returns the exit code.
func runWith(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "-help" { // Go flag's spelling, once accepted
		args = append([]string{"--help"}, args[1:]...)
	}
	root := newRootCmd(streams{stdin: stdin, stdout: stdout, stderr: stderr})
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// cobra's own errors (e.g. an argument a command refused)
		ee = &exitError{code: exitSettings, err: err, usage: true}
	}
	if ee.err != nil {
		path := "dispatcher"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		line := path + ": " + ee.err.Error()
		if ee.usage && !strings.Contains(line, "--help") {
			line += " (see " + path + " --help)"
		}
		fmt.Fprintln(stderr, line)
	}
	return ee.code
}

// queueFlag adds --queue, required by every command that acts on one
// queue.
func queueFlag(fs *pflag.FlagSet, queue *string) {
	fs.StringVarP(queue, "queue", "q", "", "the queue `Q` (required)")
}

// jsonFlag adds --json.
func jsonFlag(fs *pflag.FlagSet, on *bool) {
	fs.BoolVar(on, "json", false, "print JSON, for scripts")
}

// noArgs refuses positional arguments, in one line.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q", args[0])
	}
	return nil
}
