//go:build !linux

package bench

import (
	"errors"
	"os/exec"
)

// start is Linux's alone: cgroups are.
func (g *cgroup) start(*exec.Cmd) error { return errors.New("-cpu-cap: cgroups are Linux only") }
