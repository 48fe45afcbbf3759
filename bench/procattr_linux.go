package bench

import "syscall"

// childAttr makes a dispatcher child get SIGTERM when the bench dies, so
// a killed bench leaves no dispatchers behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
