package pki

import (
	"crypto/x509"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
)

// TestOpenSSLAccepts checks our PEMs against a second, independent
// implementation: what etcd, curl and grpcurl accept, openssl accepts too.
func TestOpenSSLAccepts(t *testing.T) {
	proctest.SkipShort(t) // runs openssl
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not on PATH")
	}
	dir := t.TempDir()
	ca := newTestCA(t, testCluster)
	if _, err := WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	openssl := func(t *testing.T, args ...string) string {
		t.Helper()
		cmd := exec.Command("openssl", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	openssl(t, "pkey", "-in", CAKeyFile, "-noout")

	for name, p := range allPrincipals {
		t.Run(name, func(t *testing.T) {
			iss := issue(t, ca, p)
			base := FileBase(p)
			if _, err := WritePair(dir, base, iss.CertPEM, iss.KeyPEM); err != nil {
				t.Fatal(err)
			}
			crt := CertFile(base)
			for _, purpose := range []string{"sslserver", "sslclient"} {
				openssl(t, "verify", "-CAfile", CACertFile, "-purpose", purpose, crt)
			}
			openssl(t, "verify", "-CAfile", CACertFile, "-verify_hostname", "localhost", "-verify_ip", "::1", crt)
			text := openssl(t, "x509", "-noout", "-text", "-in", crt)
			if uri := "URI:" + p.URI(testCluster).String(); !strings.Contains(text, uri) {
				t.Errorf("openssl x509 -text lacks %q:\n%s", uri, text)
			}
			openssl(t, "pkey", "-in", KeyFile(base), "-noout")
		})
	}

	t.Run("node key", func(t *testing.T) {
		key, err := NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		data, err := MarshalEd25519PEM(key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "node.ed25519.key"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if out := openssl(t, "pkey", "-in", "node.ed25519.key", "-noout", "-text"); !strings.Contains(out, "ED25519") {
			t.Errorf("openssl does not see an ED25519 key:\n%s", out)
		}
	})

	t.Run("CRL", func(t *testing.T) {
		revoked, kept := issue(t, ca, allPrincipals["node"]), issue(t, ca, allPrincipals["node"])
		for base, iss := range map[string]*Issued{"revoked": revoked, "kept": kept} {
			if _, err := WritePair(dir, base, iss.CertPEM, nil); err != nil {
				t.Fatal(err)
			}
		}
		crl, err := ca.CRL([]x509.RevocationListEntry{{SerialNumber: revoked.Cert.SerialNumber, RevocationTime: time.Now()}}, big.NewInt(1), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ca.crl"), crl, 0o644); err != nil {
			t.Fatal(err)
		}
		if out := openssl(t, "crl", "-in", "ca.crl", "-CAfile", CACertFile, "-noout"); !strings.Contains(out, "verify OK") {
			t.Errorf("openssl crl: %s", out)
		}
		openssl(t, "verify", "-crl_check", "-CAfile", CACertFile, "-CRLfile", "ca.crl", "kept.crt")
		cmd := exec.Command("openssl", "verify", "-crl_check", "-CAfile", CACertFile, "-CRLfile", "ca.crl", "revoked.crt")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "revoked") {
			t.Errorf("openssl verify -crl_check of a revoked certificate: %v\n%s", err, out)
		}
	})
}
