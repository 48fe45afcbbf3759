package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSettingsReferenceUpToDate: docs/reference/settings.md is what
// WriteReference makes from the struct tags, so the reference says what
// --help says and the code does.
func TestSettingsReferenceUpToDate(t *testing.T) {
	var want bytes.Buffer
	if err := WriteReference(&want); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(ReferencePath)))
	if err != nil {
		t.Fatalf("%v: run `go generate ./config/` and commit %s", err, ReferencePath)
	}
	if bytes.Equal(got, want.Bytes()) {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(want.String(), "\n")
	for i := 0; i < max(len(gl), len(wl)); i++ {
		g, w := "(end of file)", "(end of file)"
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("%s is out of date with config/config.go: run `go generate ./config/` and commit it\n"+
				"line %d is\n\t%s\nwant\n\t%s", ReferencePath, i+1, g, w)
		}
	}
}

// TestReferenceListsEverySetting: every variable of --help has its
// section in the reference, which the README links to.
func TestReferenceListsEverySetting(t *testing.T) {
	var ref bytes.Buffer
	if err := WriteReference(&ref); err != nil {
		t.Fatal(err)
	}
	var usage bytes.Buffer
	Usage(&usage)
	n := 0
	for _, line := range strings.Split(usage.String(), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(line, Prefix+"_") { // not an indented description
			continue
		}
		n++
		if !strings.Contains(ref.String(), "\n### `"+f[0]+"`\n") {
			t.Errorf("the settings reference has no section for %s", f[0])
		}
	}
	if n < 30 {
		t.Fatalf("only %d variables found in --help: the parser is broken", n)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte("]("+ReferencePath+")")) {
		t.Errorf("README.md does not link to %s", ReferencePath)
	}
}

var (
	// "1 to 4096", "0 to 10s": an inclusive range.
	descRange = regexp.MustCompile(`\b(\d+)(s|ms)? to (\d+)(s|ms)?\b`)
	// "at least 1s", "at least 0.001".
	descAtLeast = regexp.MustCompile(`\bat least (\d+(?:\.\d+)?)(s|ms)?\b`)
)

// TestDescribedRangesAreValidated: a numeric setting whose description
// gives a range ("1 to 64", "0 to 10s", "at least 1s") is accepted at its
// ends and refused, naming the variable, just outside them. The README
// once said DISPATCHER_BATCH_SIZE takes 1 to 1000 while Load took up to
// 10,000.
func TestDescribedRangesAreValidated(t *testing.T) {
	type setting struct {
		v    Var
		kind reflect.Type
	}
	var all []setting
	for _, spec := range []struct {
		prefix string
		ptr    any
	}{{Prefix, &Settings{}}, {QueuePrefix("orders"), &Queue{}}} {
		typ := reflect.TypeOf(spec.ptr).Elem()
		vs := vars(spec.prefix, spec.ptr)
		j := 0
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			if f.Tag.Get("envconfig") == "" && f.Tag.Get("env") == "" {
				continue
			}
			all = append(all, setting{vs[j], f.Type})
			j++
		}
	}
	checked := 0
	for _, s := range all {
		var lo, hi string // the values at the ends; hi "" for no upper end
		var below, above string
		durType := reflect.TypeOf(time.Duration(0))
		switch {
		case s.kind.Kind() == reflect.String || s.kind.Kind() == reflect.Bool || s.kind.Kind() == reflect.Slice:
			continue // lengths and names, checked by TestLoadErrors
		case descRange.MatchString(s.v.Desc):
			m := descRange.FindStringSubmatch(s.v.Desc)
			unit := m[4]
			lo, hi = m[1]+unit, m[3]+unit
		case descAtLeast.MatchString(s.v.Desc):
			m := descAtLeast.FindStringSubmatch(s.v.Desc)
			lo = m[1] + m[2]
		default:
			continue
		}
		switch s.kind {
		case durType:
			l, _ := time.ParseDuration(lo)
			below = (l - time.Nanosecond).String()
			if hi != "" {
				h, _ := time.ParseDuration(hi)
				above = (h + time.Nanosecond).String()
			}
		default:
			if s.kind.Kind() == reflect.Float64 {
				l, _ := strconv.ParseFloat(lo, 64)
				below = strconv.FormatFloat(l/2, 'f', -1, 64)
			} else {
				l, _ := strconv.Atoi(lo)
				below = strconv.Itoa(l - 1)
				if hi != "" {
					h, _ := strconv.Atoi(hi)
					above = strconv.Itoa(h + 1)
				}
			}
		}
		for _, c := range []struct {
			value string
			ok    bool
		}{{lo, true}, {hi, true}, {below, false}, {above, false}} {
			if c.value == "" {
				continue
			}
			checked++
			err := loadWith(t, s.v.Key, c.value)
			var ce *Error
			switch {
			case c.ok && err != nil:
				t.Errorf("%s=%s: refused (%v), but its description says %q", s.v.Key, c.value, err, s.v.Desc)
			case !c.ok && (!errors.As(err, &ce) || ce.Var != s.v.Key):
				t.Errorf("%s=%s: got %v, want it refused as its description says %q", s.v.Key, c.value, err, s.v.Desc)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d values checked: the descriptions' ranges are not found", checked)
	}
}

// loadWith loads the smallest valid settings (queue orders) with key set
// to value, the rest of the DISPATCHER_* environment cleared.
func loadWith(t *testing.T, key, value string) error {
	t.Helper()
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, Prefix+"_") {
			os.Unsetenv(k)
			t.Cleanup(func() { os.Setenv(k, v) })
		}
	}
	env := map[string]string{
		Prefix + "_QUEUES":                  "orders",
		QueuePrefix("orders") + "_SHARDS":   "16",
		QueuePrefix("orders") + "_EXCHANGE": "ex",
		key:                                 value,
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	_, err := Load()
	if err != nil {
		return fmt.Errorf("%w", err)
	}
	return nil
}
