// Command curia-pki creates a cluster's CA and the certificates of its
// services and admins (DESIGN §2), in the style of kubeadm certs or
// cockroach cert:
//
//	curia-pki init  --dir DIR --cluster NAME [--admin NAME] [--san HOST|IP]... [--force]
//	curia-pki issue --dir DIR --kind KIND [--name NAME] [--san HOST|IP]... [--out BASE] [--force]
//
// Nodes other than the bootstrap node get their certificates from the curator
// when they enrol, not from this tool.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
