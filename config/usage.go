package config

import (
	"fmt"
	"io"
	"reflect"
	"text/tabwriter"

	"github.com/dispatcher/dispatcher/internal/redact"
)

// Var describes one setting for --help and for spotting unknown variables.
type Var struct {
	Key, Default, Desc string
	Required           bool
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
		out = append(out, Var{Key: key, Default: def, Desc: f.Tag.Get("desc"), Required: f.Tag.Get("required") == "true"})
	}
	return out
}

// Usage prints every variable with its default and meaning.
func Usage(w io.Writer) {
	fmt.Fprintln(w, "dispatcher moves due tasks from sharded Redis sorted sets to RabbitMQ.")
	fmt.Fprintln(w, "\nUsage: dispatcher            run until SIGTERM or SIGINT")
	fmt.Fprintln(w, "       dispatcher --help     print this")
	fmt.Fprintln(w, "       dispatcher stats [--queue Q] [--json]")
	fmt.Fprintln(w, "                             what the queues hold, per shard, read from Redis")
	fmt.Fprintln(w, "       dispatcher schedule|cancel|dead|pause|resume --help")
	fmt.Fprintln(w, "                             schedule or cancel a task, list, requeue or purge dead letters, hold a queue")
	fmt.Fprintln(w, "       dispatcher recurring add|list|remove|pause|resume|check --help")
	fmt.Fprintln(w, "                             recurring tasks: cron schedules, one task per occurrence")
	fmt.Fprintln(w, "       dispatcher bench -h   measure throughput, lateness and cost on your Redis and broker")
	fmt.Fprintln(w, "\nSettings come from the environment:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tDEFAULT\tMEANING")
	print := func(vs []Var) {
		for _, v := range vs {
			def := v.Default
			switch {
			case v.Required:
				def = "(required)"
			case def == "":
				def = `""`
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Key, redact.URL(def), v.Desc)
		}
	}
	print(vars(Prefix, &Settings{}))
	print(vars(Prefix+"_QUEUE_<NAME>", &Queue{}))
	tw.Flush()
	fmt.Fprintln(w, "\n<NAME> is the queue name upper-cased, every character outside A-Z 0-9 written as _.")
}
