// Command kubectl is upstream's kubectl main, built only for the other Kubernetes
// releases of the e2e cluster (build.sh with RUNGUARD_E2E_KUBERNETES): kubectl supports
// one minor version of skew, so a 1.37 or 1.30 cluster gets the kubectl of its release.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // as upstream: client auth plugins
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
