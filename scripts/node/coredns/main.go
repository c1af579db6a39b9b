// The e2e tier's cluster DNS (scripts/node.sh): CoreDNS, pinned in go.mod, with
// only the plugins a test cluster's DNS needs compiled in. There is no forward
// plugin on purpose: pods resolve cluster names only and never reach the host's
// resolver (a name outside cluster.local is answered REFUSED).
package main

import (
	"fmt"
	"os"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	// Execution order as in CoreDNS's plugin.cfg.
	if err := dnsserver.SetDirectives([]string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	coremain.Run()
}
