// Command kube-controller-manager is upstream's kube-controller-manager main, built from
// the same pinned k8s.io/kubernetes release as the apiserver, so the e2e cluster's Jobs,
// Deployments and CronJobs create their Pods through the real controllers.
package main

import (
	"os"
	_ "time/tzdata" // as upstream: CronJob timeZone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // as upstream: JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as upstream: client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // as upstream: version metric
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
