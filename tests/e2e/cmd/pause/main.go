// Command pause is the real node's sandbox ("pause") image's only file: it holds the
// Pod's namespaces until the kubelet stops it. Nothing can be pulled here, so the image
// is built from this (tests/e2e/realnode.py); upstream's is a C program doing the same.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	// No reaping: the Pods here do not share their process namespace, so nothing is
	// ever orphaned to the sandbox.
	<-signals
}
