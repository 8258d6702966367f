package rpc

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

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
