package main

import (
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"curia.dev/platform/pki"
	"curia.dev/platform/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

const (
	defaultCAValidity   = 10 * 365 * 24 * time.Hour
	defaultCertValidity = 365 * 24 * time.Hour
)

// usageError is a mistake in how the command was called (exit code 2). An
// empty message means the FlagSet has reported it already.
type usageError string

func (e usageError) Error() string { return string(e) }

func usageErrorf(format string, args ...any) error {
	return usageError(fmt.Sprintf(format, args...))
}

const usage = `usage: curia-pki <command> [flags]

commands:
  init    create a cluster CA and the admin, curator and reconciler certificates
  issue   issue one more certificate from an existing CA
  version print the version

Run "curia-pki <command> -h" for the flags of a command.
`

// run is main without the process: it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var cmd func([]string, io.Writer, io.Writer) error
	switch args[0] {
	case "init":
		cmd = runInit
	case "issue":
		cmd = runIssue
	case "-version", "--version", "version":
		version.Print(stdout, "curia-pki")
		return exitOK
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "curia-pki: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	err := cmd(args[1:], stdout, stderr)
	var uerr usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &uerr):
		if uerr != "" {
			fmt.Fprintf(stderr, "curia-pki %s: %v (see curia-pki %[1]s -h)\n", args[0], uerr)
		}
		return exitUsage
	default:
		fmt.Fprintf(stderr, "curia-pki %s: %v\n", args[0], err)
		return exitError
	}
}

// sanList is a repeatable --san flag: an IP becomes an IP SAN, anything else
// a DNS SAN.
type sanList struct {
	dns []string
	ips []net.IP
}

func (s *sanList) String() string {
	if s == nil {
		return ""
	}
	parts := append([]string(nil), s.dns...)
	for _, ip := range s.ips {
		parts = append(parts, ip.String())
	}
	return strings.Join(parts, ",")
}

func (s *sanList) Set(v string) error {
	if v == "" {
		return errors.New("empty SAN")
	}
	if ip := net.ParseIP(v); ip != nil {
		s.ips = append(s.ips, ip)
	} else {
		s.dns = append(s.dns, v)
	}
	return nil
}

// withLocal adds the loopback names every serving certificate carries, so
// that local health checks and a process cluster on 127.0.0.x verify.
func (s *sanList) withLocal() ([]string, []net.IP) {
	dns := []string{"localhost"}
	for _, d := range s.dns {
		if !slices.Contains(dns, d) {
			dns = append(dns, d)
		}
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	for _, ip := range s.ips {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	return dns, ips
}

// newFlagSet returns a FlagSet that reports errors instead of exiting and
// prints its usage to stderr.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("curia-pki "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: curia-pki %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags and rejects positional arguments, which the commands
// do not take (a forgotten "--" before a value would otherwise pass).
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError("")
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func runInit(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("init", "--dir DIR --cluster NAME [--admin NAME] [--san HOST|IP]... [--force]", stderr)
	dir := fs.String("dir", "", "PKI directory to create (required)")
	cluster := fs.String("cluster", "", "cluster name, the SPIFFE trust domain (required)")
	admin := fs.String("admin", "admin", "name of the first admin, certified as admin/<name>")
	force := fs.Bool("force", false, "overwrite an existing CA and every file init writes")
	caValidity := fs.Duration("ca-validity", defaultCAValidity, "validity of the CA certificate")
	validity := fs.Duration("validity", defaultCertValidity, "validity of the issued certificates")
	var sans sanList
	fs.Var(&sans, "san", "extra DNS name or IP of the curator and reconciler certificates (repeatable)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dir == "" || *cluster == "" {
		return usageErrorf("--dir and --cluster are required")
	}
	if err := pki.ValidateCluster(*cluster); err != nil {
		return err
	}
	adminP := pki.Principal{Kind: pki.KindAdmin, Name: *admin}
	if err := adminP.Validate(); err != nil {
		return err
	}

	if !*force {
		existing, err := pki.Exists(*dir, pki.CACertFile, pki.CAKeyFile)
		if err != nil {
			return err
		}
		if len(existing) > 0 {
			return fmt.Errorf("a CA already exists in %s (%s); --force overwrites it and every certificate init writes, "+
				"and certificates issued by the old CA stop verifying", *dir, strings.Join(existing, ", "))
		}
	}

	// Everything is generated before the first byte is written, so a bad
	// request leaves the directory as it was.
	ca, err := pki.NewCA(*cluster, *caValidity)
	if err != nil {
		return err
	}
	dns, ips := sans.withLocal()
	type leaf struct {
		p      pki.Principal
		issued *pki.Issued
	}
	leaves := []leaf{
		{p: adminP},
		{p: pki.Principal{Kind: pki.KindCurator}},
		{p: pki.Principal{Kind: pki.KindReconciler}},
	}
	for i := range leaves {
		req := pki.IssueRequest{Cluster: *cluster, Principal: leaves[i].p, Validity: *validity}
		if leaves[i].p.Kind != pki.KindAdmin {
			req.DNSNames, req.IPs = dns, ips
		}
		if leaves[i].issued, err = ca.Issue(req); err != nil {
			return err
		}
	}

	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	// The CA goes last: its presence is what "already initialised" means, so
	// an init that dies half-way can simply be run again.
	var written []string
	p, err := pki.WriteCluster(*dir, *cluster)
	if err != nil {
		return err
	}
	written = append(written, p)
	for _, l := range leaves {
		paths, err := pki.WritePair(*dir, pki.FileBase(l.p), l.issued.CertPEM, l.issued.KeyPEM)
		written = append(written, paths...)
		if err != nil {
			printWritten(stdout, written)
			return err
		}
	}
	paths, err := pki.WriteCA(*dir, ca)
	written = append(written, paths...)
	printWritten(stdout, written)
	return err
}

func runIssue(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("issue", "--dir DIR --kind KIND [--name NAME] [--key KEYFILE] [--san HOST|IP]... [--out BASE] [--force]", stderr)
	dir := fs.String("dir", "", "PKI directory holding the CA (required)")
	kind := fs.String("kind", "", "principal kind: admin, curator, reconciler, node, consensus or member (required)")
	name := fs.String("name", "", "admin name or node id; for node and consensus, empty generates a new node key")
	keyFile := fs.String("key", "", "certify the public key of this private key (PEM) instead of making a new key; no key file is written")
	out := fs.String("out", "", "base name of the written files (default from kind and name)")
	force := fs.Bool("force", false, "overwrite existing certificate and key files")
	validity := fs.Duration("validity", defaultCertValidity, "validity of the certificate")
	var sans sanList
	fs.Var(&sans, "san", "extra DNS name or IP of the certificate (repeatable; not for admin)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dir == "" || *kind == "" {
		return usageErrorf("--dir and --kind are required")
	}
	p := pki.Principal{Kind: pki.Kind(*kind), Name: *name}
	if p.Kind == pki.KindAdmin && (len(sans.dns) > 0 || len(sans.ips) > 0) {
		return usageErrorf("admin certificates are for clients and take no --san")
	}

	cluster, err := pki.ReadCluster(*dir)
	if err != nil {
		return err
	}
	ca, err := pki.LoadCAFromDir(*dir)
	if err != nil {
		return err
	}

	// A node or consensus certificate without a name is for a new node: its
	// id comes from a fresh identity key, written next to the certificate.
	var nodeKeyPEM []byte
	if (p.Kind == pki.KindNode || p.Kind == pki.KindConsensus) && p.Name == "" {
		key, err := pki.NewNodeKey()
		if err != nil {
			return err
		}
		if nodeKeyPEM, err = pki.MarshalEd25519PEM(key); err != nil {
			return err
		}
		p.Name = pki.NodeID(key.Public().(ed25519.PublicKey))
	}
	if err := p.Validate(); err != nil {
		return err
	}
	base := *out
	if base == "" {
		base = pki.FileBase(p)
	}
	if err := pki.ValidateFileBase(base); err != nil {
		return usageErrorf("--out: %v", err)
	}
	targets := []string{pki.CertFile(base)}
	if *keyFile == "" {
		targets = append(targets, pki.KeyFile(base))
	}
	if nodeKeyPEM != nil {
		targets = append(targets, pki.NodeKeyFile(p.Name))
	}
	if !*force {
		existing, err := pki.Exists(*dir, targets...)
		if err != nil {
			return err
		}
		if len(existing) > 0 {
			return fmt.Errorf("%s already exists; --force overwrites it", strings.Join(existing, ", "))
		}
	}

	req := pki.IssueRequest{Cluster: cluster, Principal: p, Validity: *validity}
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			return err
		}
		key, err := pki.ParsePrivateKeyPEM(b)
		if err != nil {
			return fmt.Errorf("--key %s: %w", *keyFile, err)
		}
		req.PublicKey = key.Public()
	}
	if p.Kind != pki.KindAdmin {
		req.DNSNames, req.IPs = sans.withLocal()
	}
	issued, err := ca.Issue(req)
	if err != nil {
		return err
	}
	var written []string
	if nodeKeyPEM != nil {
		fmt.Fprintf(stdout, "node-id %s\n", p.Name)
		path := filepath.Join(*dir, pki.NodeKeyFile(p.Name))
		if err := pki.WriteFileAtomic(path, nodeKeyPEM, pki.KeyFileMode); err != nil {
			return err
		}
		written = append(written, path)
	}
	if issued.KeyPEM == nil {
		path := filepath.Join(*dir, pki.CertFile(base))
		err = pki.WriteFileAtomic(path, issued.CertPEM, pki.CertFileMode)
		printWritten(stdout, append(written, path))
		return err
	}
	paths, err := pki.WritePair(*dir, base, issued.CertPEM, issued.KeyPEM)
	written = append(written, paths...)
	printWritten(stdout, written)
	return err
}

func printWritten(w io.Writer, paths []string) {
	for _, p := range paths {
		fmt.Fprintf(w, "wrote %s\n", p)
	}
}
