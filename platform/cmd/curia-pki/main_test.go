package main

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"curia.dev/platform/pki"
)

type result struct {
	code           int
	stdout, stderr string
}

func runCmd(args ...string) result {
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

func mustRun(t *testing.T, args ...string) result {
	t.Helper()
	r := runCmd(args...)
	if r.code != 0 {
		t.Fatalf("curia-pki %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// snapshot reads every file of dir with its mode.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = info.Mode().String() + "\n" + string(b)
	}
	return files
}

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.ParseCertPEM(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func verify(t *testing.T, dir string, cert *x509.Certificate) error {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pki.CertPool(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	r := mustRun(t, "init", "--dir", dir, "--cluster", "prod.example", "--admin", "alice",
		"--san", "curia.example.com", "--san", "10.0.0.7", "--san", "localhost", "--san", "::1")

	wantModes := map[string]fs.FileMode{
		"cluster":         0o644,
		"ca.crt":          0o644,
		"ca.key":          0o600,
		"crl.pem":         0o644,
		"admin-alice.crt": 0o644,
		"admin-alice.key": 0o600,
		"curator.crt":     0o644,
		"curator.key":     0o600,
		"reconciler.crt":  0o644,
		"reconciler.key":  0o600,
	}
	files := snapshot(t, dir)
	if len(files) != len(wantModes) {
		t.Errorf("directory holds %v, want exactly %d files", slices.Sorted(maps.Keys(files)), len(wantModes))
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != len(wantModes) {
		t.Errorf("printed %d lines, want one per file:\n%s", len(lines), r.stdout)
	}
	for name, mode := range wantModes {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), mode)
		}
		if !strings.Contains(r.stdout, filepath.Join(dir, name)+"\n") {
			t.Errorf("output does not mention %s:\n%s", name, r.stdout)
		}
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("directory mode: %v, %v; want 0700", st.Mode().Perm(), err)
	}
	if cluster, err := pki.ReadCluster(dir); err != nil || cluster != "prod.example" {
		t.Errorf("ReadCluster = %q, %v", cluster, err)
	}

	for base, want := range map[string]pki.Principal{
		"admin-alice": {Kind: pki.KindAdmin, Name: "alice"},
		"curator":     {Kind: pki.KindCurator},
		"reconciler":  {Kind: pki.KindReconciler},
	} {
		c := loadCert(t, filepath.Join(dir, base+".crt"))
		if err := verify(t, dir, c); err != nil {
			t.Errorf("%s does not verify: %v", base, err)
		}
		if p, err := pki.PrincipalFromCert(c, "prod.example"); err != nil || p != want {
			t.Errorf("%s: principal %v, %v; want %v", base, p, err, want)
		}
		if want.Kind == pki.KindAdmin {
			continue
		}
		// Service certificates serve on loopback and on every --san.
		if !slices.Equal(c.DNSNames, []string{"localhost", "curia.example.com"}) {
			t.Errorf("%s: DNS SANs %v", base, c.DNSNames)
		}
		var ips []string
		for _, ip := range c.IPAddresses {
			ips = append(ips, ip.String())
		}
		if !slices.Equal(ips, []string{"127.0.0.1", "::1", "10.0.0.7"}) {
			t.Errorf("%s: IP SANs %v", base, ips)
		}
		if err := c.VerifyHostname("10.0.0.7"); err != nil {
			t.Errorf("%s: %v", base, err)
		}
	}
}

func TestInitRefusesThenForce(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "init", "--dir", dir, "--cluster", "c1")
	before := snapshot(t, dir)
	oldCurator := loadCert(t, filepath.Join(dir, "curator.crt"))

	for name, args := range map[string][]string{
		"same cluster":  {"init", "--dir", dir, "--cluster", "c1"},
		"other cluster": {"init", "--dir", dir, "--cluster", "c2", "--admin", "bob"},
	} {
		t.Run(name, func(t *testing.T) {
			r := runCmd(args...)
			if r.code != 1 {
				t.Errorf("exit %d, want 1", r.code)
			}
			if !strings.Contains(r.stderr, "already exists") || !strings.Contains(r.stderr, "--force") {
				t.Errorf("stderr %q does not say the CA exists and that --force overwrites", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing written", r.stdout)
			}
			if after := snapshot(t, dir); !maps.Equal(before, after) {
				t.Error("refused init changed the directory")
			}
		})
	}

	// Only the key left behind still counts as an existing CA.
	if err := os.Remove(filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	if r := runCmd("init", "--dir", dir, "--cluster", "c1"); r.code != 1 {
		t.Errorf("init over a lone ca.key: exit %d, want 1", r.code)
	}

	mustRun(t, "init", "--dir", dir, "--cluster", "c1", "--force")
	after := snapshot(t, dir)
	for _, f := range []string{"ca.crt", "ca.key", "curator.crt", "curator.key"} {
		if before[f] == after[f] {
			t.Errorf("--force left %s unchanged", f)
		}
	}
	if err := verify(t, dir, oldCurator); err == nil {
		t.Error("a certificate of the replaced CA still verifies")
	}
	if err := verify(t, dir, loadCert(t, filepath.Join(dir, "curator.crt"))); err != nil {
		t.Errorf("new curator certificate: %v", err)
	}
}

func TestIssueNode(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "init", "--dir", dir, "--cluster", "c1")

	for _, kind := range []pki.Kind{pki.KindNode, pki.KindConsensus} {
		t.Run(string(kind), func(t *testing.T) {
			r := mustRun(t, "issue", "--dir", dir, "--kind", string(kind), "--san", "node1.example", "--san", "192.0.2.1")
			first, _, _ := strings.Cut(r.stdout, "\n")
			id, ok := strings.CutPrefix(first, "node-id ")
			if !ok {
				t.Fatalf("first line %q does not print the node id", first)
			}

			keyPath := filepath.Join(dir, pki.NodeKeyFile(id))
			st, err := os.Stat(keyPath)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("node key %s: %v, %v; want mode 0600", keyPath, st, err)
			}
			keyPEM, err := os.ReadFile(keyPath)
			if err != nil {
				t.Fatal(err)
			}
			key, err := pki.ParseEd25519PEM(keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			if got := pki.NodeID(key.Public().(ed25519.PublicKey)); got != id {
				t.Errorf("printed id %s, but the written key is node %s", id, got)
			}

			want := pki.Principal{Kind: kind, Name: id}
			base := pki.FileBase(want)
			c := loadCert(t, filepath.Join(dir, pki.CertFile(base)))
			if p, err := pki.PrincipalFromCert(c, "c1"); err != nil || p != want {
				t.Errorf("principal %v, %v; want %v", p, err, want)
			}
			if err := verify(t, dir, c); err != nil {
				t.Errorf("certificate does not verify: %v", err)
			}
			if !slices.Contains(c.DNSNames, "node1.example") || !slices.ContainsFunc(c.IPAddresses, net.ParseIP("192.0.2.1").Equal) {
				t.Errorf("SANs %v %v lack the --san values", c.DNSNames, c.IPAddresses)
			}
			if st, err := os.Stat(filepath.Join(dir, pki.KeyFile(base))); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("TLS key: %v; want mode 0600", err)
			}
			if n := strings.Count(r.stdout, "wrote "); n != 3 {
				t.Errorf("printed %d written files, want 3 (node key, key, cert):\n%s", n, r.stdout)
			}

			// The same node again: refused, then forced.
			before := snapshot(t, dir)
			again := runCmd("issue", "--dir", dir, "--kind", string(kind), "--name", id)
			if again.code != 1 || !strings.Contains(again.stderr, "--force") {
				t.Errorf("re-issue without --force: exit %d, stderr %q; want 1 and a hint at --force", again.code, again.stderr)
			}
			if !maps.Equal(before, snapshot(t, dir)) {
				t.Error("refused issue changed the directory")
			}
			mustRun(t, "issue", "--dir", dir, "--kind", string(kind), "--name", id, "--force")
			if c2 := loadCert(t, filepath.Join(dir, pki.CertFile(base))); c2.Equal(c) {
				t.Error("--force did not replace the certificate")
			}
		})
	}
}

func TestIssueNamed(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "init", "--dir", dir, "--cluster", "c1")
	mustRun(t, "issue", "--dir", dir, "--kind", "admin", "--name", "bob")
	mustRun(t, "issue", "--dir", dir, "--kind", "curator", "--out", "curator-2")
	for file, want := range map[string]pki.Principal{
		"admin-bob.crt": {Kind: pki.KindAdmin, Name: "bob"},
		"curator-2.crt": {Kind: pki.KindCurator},
	} {
		c := loadCert(t, filepath.Join(dir, file))
		if p, err := pki.PrincipalFromCert(c, "c1"); err != nil || p != want {
			t.Errorf("%s: principal %v, %v; want %v", file, p, err, want)
		}
	}
}

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "init", "--dir", dir, "--cluster", "c1")
	empty := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		code int
	}{
		"no command":          {args: nil, code: 2},
		"unknown command":     {args: []string{"frobnicate"}, code: 2},
		"unknown flag":        {args: []string{"init", "--bogus"}, code: 2},
		"init without dir":    {args: []string{"init", "--cluster", "c1"}, code: 2},
		"init positional":     {args: []string{"init", "--dir", empty, "--cluster", "c1", "extra"}, code: 2},
		"issue without kind":  {args: []string{"issue", "--dir", dir}, code: 2},
		"issue --out escapes": {args: []string{"issue", "--dir", dir, "--kind", "curator", "--out", "../x"}, code: 2},
		"help":                {args: []string{"init", "-h"}, code: 0},
		"bad cluster":         {args: []string{"init", "--dir", empty, "--cluster", "Bad Name"}, code: 1},
		"bad admin":           {args: []string{"init", "--dir", empty, "--cluster", "c1", "--admin", "Root!"}, code: 1},
		"unknown kind":        {args: []string{"issue", "--dir", dir, "--kind", "root"}, code: 1},
		"curator with name":   {args: []string{"issue", "--dir", dir, "--kind", "curator", "--name", "x"}, code: 1},
		"bad node id":         {args: []string{"issue", "--dir", dir, "--kind", "node", "--name", "node-1"}, code: 1},
		"issue without CA":    {args: []string{"issue", "--dir", empty, "--kind", "curator"}, code: 1},
	} {
		t.Run(name, func(t *testing.T) {
			r := runCmd(tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d\nstderr:\n%s", r.code, tc.code, r.stderr)
			}
			if tc.code != 0 && r.stderr == "" {
				t.Error("failed without a word on stderr")
			}
		})
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("failed commands wrote into %s: %v", empty, entries)
	}
}

// TestIssueWithKey: the bootstrap node's consensus and member certificates
// certify one key, the consensus process's: --key certifies a key that
// exists and writes no key.
func TestIssueWithKey(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "init", "--dir", dir, "--cluster", "c1")
	r := mustRun(t, "issue", "--dir", dir, "--kind", "consensus")
	id := strings.TrimPrefix(strings.SplitN(r.stdout, "\n", 2)[0], "node-id ")
	consKey := filepath.Join(dir, pki.KeyFile(pki.FileBase(pki.Principal{Kind: pki.KindConsensus, Name: id})))
	r = mustRun(t, "issue", "--dir", dir, "--kind", "member", "--name", id, "--key", consKey)
	member := pki.Principal{Kind: pki.KindMember, Name: id}
	base := pki.FileBase(member)
	c := loadCert(t, filepath.Join(dir, pki.CertFile(base)))
	if p, err := pki.PrincipalFromCert(c, "c1"); err != nil || p != member {
		t.Errorf("principal %v, %v; want %v", p, err, member)
	}
	keyPEM, err := os.ReadFile(consKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(c.PublicKey) {
		t.Error("the member certificate is not of the given key")
	}
	if _, err := os.Stat(filepath.Join(dir, pki.KeyFile(base))); err == nil {
		t.Error("--key wrote a key file")
	}
	if n := strings.Count(r.stdout, "wrote "); n != 1 {
		t.Errorf("wrote %d files, want the certificate alone:\n%s", n, r.stdout)
	}
}
