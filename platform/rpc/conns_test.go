package rpc

import (
	"testing"

	"curia.dev/platform/pki"
)

func TestConnsDialEachAddressOnce(t *testing.T) {
	ca := newTestCA(t)
	cert, key, _ := ca.issue(t, node1.URI(testCluster).String())
	creds, err := NewCredentials(testCluster, ca.pem, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c := NewConns(ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	a1, err := c.Get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := c.Get("127.0.0.1:1")
	b, _ := c.Get("127.0.0.1:2")
	if a1 != a2 || a1 == b {
		t.Fatalf("Get gave %p, %p for one address and %p for another: want the first two the same, the third its own", a1, a2, b)
	}
	c.Close()
	a3, _ := c.Get("127.0.0.1:1")
	if a3 == a1 {
		t.Fatal("Get after Close gave the closed connection")
	}
	c.Close()
}
