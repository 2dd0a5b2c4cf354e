// Command kubelet is upstream's kubelet main, built from the same pinned
// k8s.io/kubernetes release as the apiserver: the e2e cluster's real node, which runs
// Pods with containerd and runc (tests/e2e/realnode.py). Up to 1.33 NewKubeletCommand
// takes no argument; main_context.go is the later releases' (build.sh sets the tag).

//go:build !kubelet_context

package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // as upstream: JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as upstream: client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // as upstream: version metric
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	command := app.NewKubeletCommand()
	code := cli.Run(command)
	os.Exit(code)
}
