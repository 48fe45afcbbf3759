package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
)

// start starts cmd inside the cgroup, so that the child is capped from
// its first instruction: on cgroup v2 the kernel places it there as it is
// made (clone3 with CLONE_INTO_CGROUP); on v1 it is forked from a thread
// moved into the cgroup for the moment (v1 places each thread on its own,
// and a child starts in its parent thread's cgroup). It then checks that
// the child is there.
func (g *cgroup) start(cmd *exec.Cmd) error {
	if g.version == 2 {
		fd, err := syscall.Open(g.dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("-cpu-cap: open %s: %w", g.dir, err)
		}
		defer syscall.Close(fd)
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		if err := cmd.Start(); err != nil {
			return err
		}
	} else if err := g.startV1(cmd); err != nil {
		return err
	}
	if err := g.holds(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	return nil
}

// startV1 forks cmd from a thread of this process placed in the cgroup,
// then puts the thread back where it was. Should that fail, the thread
// ends with its goroutine (still locked to it) instead of serving others
// under the cap; the child, whose parent thread it is, then gets its
// death signal, and the error says why.
func (g *cgroup) startV1(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tid := syscall.Gettid()
		home, err := threadCgroup(tid)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		if err := writeTid(filepath.Join(g.dir, "tasks"), tid); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		startErr := cmd.Start()
		if err := writeTid(filepath.Join(g.root, home, "tasks"), tid); err != nil {
			if startErr == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			errc <- fmt.Errorf("%w (the child was stopped)", err) // the thread ends locked
			return
		}
		runtime.UnlockOSThread()
		errc <- startErr
	}()
	return <-errc
}

func writeTid(path string, tid int) error {
	if err := os.WriteFile(path, []byte(strconv.Itoa(tid)), 0o644); err != nil {
		return fmt.Errorf("-cpu-cap: move thread %d into %s: %w", tid, filepath.Dir(path), err)
	}
	return nil
}
