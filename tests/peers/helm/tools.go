//go:build tools

// Package peers pins helm (v3.22.0), which tests/e2e-k8s/install.sh uses to install
// install/helm/gpushare on the one-node cluster of tests/e2e-k8s/cluster.sh. The harness
// builds it from this wrapper module:
//
//	go build -trimpath -o DIR/helm helm.sh/helm/v3/cmd/helm
package peers

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
