// The real node's pod sandbox image (tests/realnode.py), in place of Kubernetes' pause image where no
// registry can be reached: it holds a pod's namespaces and does nothing until told to stop, reaping the
// children a shared process namespace leaves to it. Built by scripts/envtest.sh (component "pause").
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
