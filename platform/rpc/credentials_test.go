package rpc

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"curia.dev/platform/pki"
)

func TestNewCredentials(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	goodCert, goodKey, _ := ca.issue(t, node1.URI(testCluster).String())
	_, otherKey, _ := ca.issue(t, node1.URI(testCluster).String())
	foreignCert, foreignKey, _ := other.issue(t, node1.URI(testCluster).String())
	anonCert, anonKey, _ := ca.issue(t)
	wrongClusterCert, wrongClusterKey, _ := ca.issue(t, "spiffe://other.cluster/curator")

	tests := map[string]struct {
		cluster             string
		caPEM, certPEM, key []byte
		wantErr             bool
	}{
		"valid":               {cluster: testCluster, caPEM: ca.pem, certPEM: goodCert, key: goodKey},
		"bad cluster name":    {cluster: "Not A Cluster", caPEM: ca.pem, certPEM: goodCert, key: goodKey, wantErr: true},
		"no CA":               {cluster: testCluster, caPEM: []byte("junk"), certPEM: goodCert, key: goodKey, wantErr: true},
		"key of another cert": {cluster: testCluster, caPEM: ca.pem, certPEM: goodCert, key: otherKey, wantErr: true},
		"cert of another CA":  {cluster: testCluster, caPEM: ca.pem, certPEM: foreignCert, key: foreignKey, wantErr: true},
		"no identity":         {cluster: testCluster, caPEM: ca.pem, certPEM: anonCert, key: anonKey, wantErr: true},
		"other cluster":       {cluster: testCluster, caPEM: ca.pem, certPEM: wrongClusterCert, key: wrongClusterKey, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := NewCredentials(tc.cluster, tc.caPEM, tc.certPEM, tc.key)
			if tc.wantErr {
				if err == nil {
					t.Fatal("NewCredentials accepted bad material")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Principal != node1 || c.Cluster != testCluster || c.CAPool == nil || string(c.CAPEM) != string(ca.pem) {
				t.Fatalf("credentials = %+v", c)
			}
		})
	}
}

func TestLoadCredentials(t *testing.T) {
	ca := newTestCA(t)
	certPEM, keyPEM, _ := ca.issue(t, pki.Principal{Kind: pki.KindConsensus, Name: node1.Name}.URI(testCluster).String())
	dir := t.TempDir()
	files := TLSFiles{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	files.AddFlags(fs, "tls")
	args := []string{}
	for flagName, content := range map[string][]byte{"ca": ca.pem, "cert": certPEM, "key": keyPEM} {
		path := filepath.Join(dir, flagName+".pem")
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-tls-"+flagName+"="+path)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}

	c, err := LoadCredentials(testCluster, files)
	if err != nil {
		t.Fatal(err)
	}
	if c.Principal.Kind != pki.KindConsensus {
		t.Fatalf("principal = %v", c.Principal)
	}
	if _, err := LoadCredentials(testCluster, TLSFiles{CA: files.CA, Cert: files.Cert}); err == nil {
		t.Fatal("LoadCredentials accepted a missing key path")
	}
	if _, err := LoadCredentials(testCluster, TLSFiles{CA: files.CA, Cert: files.Cert, Key: filepath.Join(dir, "nope")}); err == nil {
		t.Fatal("LoadCredentials accepted a missing key file")
	}
}

// TestRenew: self-signed credentials take a certificate of their key for
// their principal (and nothing else), present it, and present the
// self-signed one again once it expired, so that the process can be given
// a new one.
func TestRenew(t *testing.T) {
	// Fake time (testing/synctest): the CA, the certificates and the
	// expiry all live on the bubble's clock.
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA(testCluster, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		key, err := pki.NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, err := pki.MarshalEd25519PEM(key)
		if err != nil {
			t.Fatal(err)
		}
		p := pki.Principal{Kind: pki.KindConsensus, Name: node1.Name}
		c, err := NewSelfSignedCredentials(testCluster, ca.CertPEM, key, p)
		if err != nil {
			t.Fatal(err)
		}
		if !c.SelfSigned() {
			t.Fatal("new self-signed credentials are not self-signed")
		}
		issue := func(p pki.Principal, validity time.Duration) []byte {
			iss, err := ca.Issue(pki.IssueRequest{Cluster: testCluster, Principal: p, PublicKey: key.Public(), Validity: validity})
			if err != nil {
				t.Fatal(err)
			}
			return iss.CertPEM
		}
		if err := c.Renew(issue(pki.Principal{Kind: pki.KindMember, Name: node1.Name}, time.Hour), keyPEM); err == nil {
			t.Fatal("renewed with a certificate of another principal")
		}
		short := issue(p, 2*time.Second)
		if err := c.Renew(short, keyPEM); err != nil {
			t.Fatal(err)
		}
		if c.SelfSigned() || c.Leaf().NotAfter.After(time.Now().Add(3*time.Second)) {
			t.Fatalf("after Renew: self-signed %v, expires %v", c.SelfSigned(), c.Leaf().NotAfter)
		}
		// The condition is the time itself: the bubble's clock moves past the
		// expiry at once.
		time.Sleep(2 * time.Second)
		if c.SelfSigned() {
			t.Fatal("self-signed again before the certificate expired")
		}
		time.Sleep(time.Second)
		if !c.SelfSigned() {
			t.Fatal("the expired certificate is still presented")
		}
	})
}
