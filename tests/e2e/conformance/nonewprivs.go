// Stands in for Kubernetes' e2e-test-images/nonewprivs in tests/e2e/conformance.sh: installed
// setuid root, it prints the effective uid it runs with, which tells whether the kernel's
// no_new_privs flag kept the setuid bit from taking effect.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
