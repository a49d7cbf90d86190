//go:build tools

// Package peers pins the Kubernetes components (v1.36.3) and etcd (v3.6.8, the
// version kubeadm 1.36 deploys) that tests/e2e-k8s/cluster.sh runs as a
// one-node cluster. The harness builds them from this wrapper module:
//
//	go build -trimpath -o DIR/ k8s.io/kubernetes/cmd/kube-apiserver ...
//	go build -trimpath -o DIR/etcd go.etcd.io/etcd/server/v3
package peers

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
