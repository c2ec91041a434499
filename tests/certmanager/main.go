// A cut-down cert-manager controller for the tests: the real controllers of cert-manager's
// pkg/controller, run the way cert-manager's own cmd/controller runs them (controller.Known(),
// NewContextFactory, one Run per controller, then the shared informer factories), but only those a
// Certificate issued by a SelfSigned or CA Issuer/ClusterIssuer needs. cert-manager's cmd/controller
// is a module of its own that the Go module proxy does not serve, so this replaces it.
// Built by scripts/certmanager.sh into a cache outside the repo. No webhook, no cainjector, no ACME
// issuer, no leader election, no metrics/healthz servers.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Each package registers its controller with controller.Known() in init(); only these are linked.
	// The Certificate lifecycle: trigger -> key manager -> request manager -> issuing, plus readiness
	// (the Ready condition) and revision manager (prunes old CertificateRequests).
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	// Signers only act on Approved CertificateRequests; without a policy engine this approves all.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	// Sign CertificateRequests of CA and SelfSigned issuers.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	// Set the Ready condition of Issuers/ClusterIssuers (the signers wait for it), through the issuer
	// implementations registered below.
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	// klog's flags (-v=4 for cert-manager's debug logs) beside ours; Go's flag package takes
	// --name as well as -name.
	klog.InitFlags(flag.CommandLine)
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster (empty: in-cluster config)")
	master := flag.String("master", "", "API server address, overrides the kubeconfig's")
	clusterResourceNamespace := flag.String("cluster-resource-namespace", "kube-system",
		"namespace of the Secrets that ClusterIssuers refer to")
	namespace := flag.String("namespace", "", "watch only this namespace (empty: all; disables ClusterIssuers)")
	workers := flag.Int("workers", 5, "workers per controller")
	controllers := flag.String("controllers", "", "comma-separated subset of the controllers to run (default: all linked in)")
	flag.Parse()

	logf.InitLogs()
	defer logf.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")

	if err := run(ctx, *kubeconfig, *master, *clusterResourceNamespace, *namespace, *workers, *controllers); err != nil {
		logf.Log.Error(err, "cert-manager controller failed")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, master, clusterResourceNamespace, namespace string, workers int, only string) error {
	log := logf.FromContext(ctx)

	// The defaults of cert-manager's own controller (internal/apis/config/controller/v1alpha1).
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		APIServerHost:      master,
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		Namespace:          namespace,
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace: clusterResourceNamespace,
		},
		CertificateOptions: controller.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return err
	}
	// The base Context: its informer factories are shared by every controller built from factory.
	base, err := factory.Build()
	if err != nil {
		return err
	}

	names := make([]string, 0, len(controller.Known()))
	for n := range controller.Known() {
		names = append(names, n)
	}
	sort.Strings(names)
	if only != "" {
		names = strings.Split(only, ",")
	}

	g, gctx := errgroup.WithContext(ctx)
	started := []string{}
	for _, n := range names {
		// as upstream: no ClusterIssuers when scoped to one namespace
		if namespace != "" && n == "clusterissuers" {
			continue
		}
		fn, ok := controller.Known()[n]
		if !ok {
			return fmt.Errorf("unknown controller %q", n)
		}
		iface, err := fn(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", n, err)
		}
		g.Go(func() error { return iface.Run(workers, gctx) })
		started = append(started, n)
	}
	log.Info("started controllers", "controllers", started, "clusterResourceNamespace", clusterResourceNamespace)

	// Informers are started after every controller has registered the ones it uses.
	base.SharedInformerFactory.Start(gctx.Done())
	base.KubeSharedInformerFactory.Start(gctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(gctx.Done())

	err = g.Wait()
	base.HTTP01ResourceMetadataInformersFactory.Shutdown()
	base.KubeSharedInformerFactory.Shutdown()
	base.SharedInformerFactory.Shutdown()
	if err != nil && ctx.Err() == nil {
		return err
	}
	log.Info("control loops exited")
	return nil
}
