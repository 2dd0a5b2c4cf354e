// Command kube-scheduler is upstream's kube-scheduler main, built from the same pinned
// k8s.io/kubernetes release as the apiserver, so the e2e cluster's Pods are placed on
// its simulated nodes by the real scheduler.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // as upstream: JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as upstream: client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // as upstream: version metric
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
