// Command kube is one multi-call program holding the Kubernetes control plane that
// hack/local-cluster runs: etcd, kube-apiserver, kube-scheduler, kube-controller-manager
// and kubectl, all built from the published Go modules (no Kubernetes source is copied
// here). Each component still runs as its own process: in one process they would share
// feature-gate registries, klog flags and the metrics registry.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = "usage: kube etcd|kube-apiserver|kube-scheduler|kube-controller-manager|kubectl [flags]"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	var cmd *cobra.Command
	switch os.Args[1] {
	case "etcd":
		os.Exit(runEtcd(os.Args[2:]))
	case "kube-apiserver":
		cmd = apiserver.NewAPIServerCommand()
	case "kube-scheduler":
		cmd = scheduler.NewSchedulerCommand()
	case "kube-controller-manager":
		cmd = controllermanager.NewControllerManagerCommand()
	case "kubectl":
		cmd = kubectl.NewDefaultKubectlCommand()
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	cmd.SetArgs(os.Args[2:])
	os.Exit(cli.Run(cmd))
}
