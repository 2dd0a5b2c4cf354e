// Command kube-apiserver is upstream's kube-apiserver main, built from a pinned
// k8s.io/kubernetes release so the e2e tests run against a real apiserver.
package main

import (
	"os"
	_ "time/tzdata" // as upstream: CronJob timeZone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // as upstream: JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // as upstream: client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // as upstream: version metric
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
