package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/version"
)

// app is one curiactl invocation: its global flags and, once a command
// needs it, its connection to the curators.
type app struct {
	getenv         func(string) string
	stdout, stderr io.Writer

	curators, reconcilers string
	ca, cert, key         string
	cluster               string
	output                string
	timeout               time.Duration

	creds *rpc.Credentials
	conns []*grpc.ClientConn

	// The config file (settings.go): --config and --context, and the
	// file once loaded.
	configFlag, contextFlag string
	cfgLoaded               bool
	cfgFile                 *configFile
	cfgPath                 string
	cfgErr                  error
}

// Where each connection setting comes from when its flag is not given: the
// variables .curia/env (make run) and .curia-compose/env (make up) export.
const (
	envCurators    = "CURIA_CURATORS"
	envCurator     = "CURIA_CURATOR"
	envCA          = "CURIA_CACERT"
	envCert        = "CURIA_ADMIN_CERT"
	envKey         = "CURIA_ADMIN_KEY"
	envCluster     = "CURIA_CLUSTER"
	envReconcilers = "CURIA_RECONCILERS"
	envReconciler  = "CURIA_RECONCILER"
)

const rootLong = `curiactl operates a curia cluster through the curators' Management API,
over mutual TLS with an admin certificate. Any curator address works:
followers forward every call to the leader.

Connection settings come from the flags, else from the variables that
.curia/env (make run) and .curia-compose/env (make up) export, else from
the current context of the config file (--config, $CURIACTL_CONFIG,
default ~/.config/curia/config.yaml; --context, $CURIACTL_CONTEXT, else
its current-context; curiactl context --help shows its format):
  --curator      $CURIA_CURATORS, else $CURIA_CURATOR (host:port[,host:port...])   curators
  --ca           $CURIA_CACERT                                                     ca
  --cert         $CURIA_ADMIN_CERT                                                 cert
  --key          $CURIA_ADMIN_KEY                                                  key
  --cluster      $CURIA_CLUSTER, else the trust domain of the --cert certificate   cluster
  --reconciler   $CURIA_RECONCILERS, else $CURIA_RECONCILER (status, plan)         reconcilers
  --consensus    $CURIA_CONSENSUS (recover, snapshot restore)                      consensus

Output is an aligned table; -o json (protojson) or -o yaml for scripts.
Certificates are never printed.

` + exitCodesHelp

func newRoot(getenv func(string) string, stdout, stderr io.Writer) (*cobra.Command, *app) {
	a := &app{getenv: getenv, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "curiactl",
		Short: "Operate a curia cluster",
		Long:  rootLong,
		Example: `  source .curia/env        # after make run
  curiactl status
  curiactl nodes list --filter 'node.state == NODE_STATE_UP'
  curiactl config get -o json`,
		Version:           version.String(),
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(*cobra.Command, []string) error { return a.checkOutput() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.curators, "curator", "", "curator address(es), host:port[,host:port...] (default $CURIA_CURATORS, else $CURIA_CURATOR)")
	pf.StringVar(&a.ca, "ca", "", "cluster CA certificate, PEM (default $CURIA_CACERT)")
	pf.StringVar(&a.cert, "cert", "", "admin certificate, PEM (default $CURIA_ADMIN_CERT)")
	pf.StringVar(&a.key, "key", "", "admin private key, PEM (default $CURIA_ADMIN_KEY)")
	pf.StringVar(&a.cluster, "cluster", "", "cluster name, the trust domain (default $CURIA_CLUSTER, else the --cert certificate's)")
	pf.StringVar(&a.reconcilers, "reconciler", "", "reconciler address(es) status asks for the active one (default $CURIA_RECONCILERS)")
	pf.StringVar(&a.configFlag, "config", "", "config file with named contexts (default $"+envConfig+", else ~/.config/curia/config.yaml)")
	pf.StringVar(&a.contextFlag, "context", "", "the context of the config file to use (default $"+envContext+", else its current-context)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	pf.DurationVar(&a.timeout, "timeout", 15*time.Second, "give up on a call after this long (audit tail -f follows until interrupted)")
	root.AddCommand(a.statusCmd(), a.planCmd(), a.nodesCmd(), a.configCmd(), a.auditCmd(), a.snapshotCmd(), a.recoverCmd(), a.contextCmd())
	return root, a
}

// args wraps a cobra argument check so that its failure is a usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return usageError{err}
		}
		return nil
	}
}

func (a *app) checkOutput() error {
	switch a.output {
	case "table", "json", "yaml":
		return nil
	}
	return usageError{fmt.Errorf("--output %q: want table, json or yaml", a.output)}
}

// credentials loads the admin credentials, once.
func (a *app) credentials() (*rpc.Credentials, error) {
	if a.creds != nil {
		return a.creds, nil
	}
	var files rpc.TLSFiles
	for _, s := range []struct {
		dst  *string
		name string
		flag string
	}{
		{&files.CA, setCA, a.ca},
		{&files.Cert, setCert, a.cert},
		{&files.Key, setKey, a.key},
	} {
		v, _, err := a.setting(s.name, s.flag)
		if err != nil {
			return nil, err
		}
		if v == "" {
			return nil, a.missing(s.name, s.name)
		}
		*s.dst = v
	}
	cluster, _, err := a.setting(setCluster, a.cluster)
	if err != nil {
		return nil, err
	}
	if cluster == "" {
		if cluster, err = trustDomain(files.Cert); err != nil {
			return nil, configError{fmt.Errorf("no cluster name: pass --cluster or set %s, or cluster in the context (%w)", envCluster, err)}
		}
	}
	creds, err := rpc.LoadCredentials(cluster, files)
	if err != nil {
		return nil, configError{fmt.Errorf("admin credentials: %w", err)}
	}
	if creds.Principal.Kind != pki.KindAdmin {
		fmt.Fprintf(a.stderr, "curiactl: warning: %s is %s, not an admin: the Management API will refuse most calls\n", files.Cert, creds.Principal)
	}
	a.creds = creds
	return creds, nil
}

// trustDomain reads the cluster name from the SPIFFE URI of the first
// certificate of the PEM file at path.
func trustDomain(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return "", fmt.Errorf("%s: no PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host != "" {
			return u.Host, nil
		}
	}
	return "", fmt.Errorf("%s: no spiffe:// URI", path)
}

// dial connects to the replicas at addrs (comma-separated), servers of kind.
func (a *app) dial(addrs string, kind pki.Kind) (*grpc.ClientConn, error) {
	creds, err := a.credentials()
	if err != nil {
		return nil, err
	}
	cc, err := rpc.DialAny(splitAddrs(addrs), rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{kind}})
	if err != nil {
		return nil, err
	}
	a.conns = append(a.conns, cc)
	return cc, nil
}

// mgmt is a Management client of the curators.
func (a *app) mgmt() (curatorv1.ManagementClient, error) {
	addrs, _, err := a.setting(setCurators, a.curators)
	if err != nil {
		return nil, err
	}
	if addrs == "" {
		return nil, a.missing(setCurators, "curator address")
	}
	if _, err := a.credentials(); err != nil {
		return nil, err
	}
	cc, err := a.dial(addrs, pki.KindCurator)
	if err != nil {
		return nil, configError{err}
	}
	return curatorv1.NewManagementClient(cc), nil
}

func (a *app) close() {
	for _, c := range a.conns {
		c.Close()
	}
	a.conns = nil
}

// call is the context of one call: the command's, bounded by --timeout.
func (a *app) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.timeout)
}
