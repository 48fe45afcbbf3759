package main

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// buildVersion is set at link time, e.g.
// go build -ldflags "-X main.buildVersion=v1.2.3" ./cmd/dispatcher;
// otherwise the version comes from the build info: the module version
// for go install ...@v1.2.3, or the VCS revision of a checkout.
var buildVersion string

// version is what dispatcher --version prints.
func version() string {
	v := buildVersion
	info, ok := debug.ReadBuildInfo()
	if v == "" && ok {
		v = info.Main.Version // "(devel)" when built without module or VCS version
	}
	if v == "" {
		v = "(devel)"
	}
	if ok {
		var rev, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = "+dirty"
				}
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && !strings.Contains(v, rev) {
			v += " (" + rev + modified + ")"
		}
	}
	return v + " " + runtime.Version()
}
