//go:build tools

// Package tools pins the commands scripts/envtest.sh builds, so `go mod tidy` keeps their dependencies:
// the control plane, kubectl, the real node's kubelet and kube-proxy (tests/realnode.py), and kubeadm
// (the kind node image, scripts/kind.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
