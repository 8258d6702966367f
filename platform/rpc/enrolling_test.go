package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"curia.dev/platform/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
)

func TestServerEnrolling(t *testing.T) {
	env := startServer(t, func(cfg *ServerConfig) { cfg.AllowEnrolling = true })
	key := newNodeKey(t)
	node := enrolling(key)
	conn := env.dialEnrolling(t, key)
	asNode := func(*testing.T) *grpc.ClientConn { return conn }

	tests := map[string]struct {
		conn     func(t *testing.T) *grpc.ClientConn
		method   string
		wantCode codes.Code
		wantMsg  string // part of the status message, or the reply if OK
	}{
		"enrolling node, method open to it": {
			conn: asNode, method: echoMethod("Register"),
			wantCode: codes.OK, wantMsg: node.String() + ":hello",
		},
		"enrolling node, other method": {
			conn: asNode, method: echoMethod("Echo"),
			wantCode: codes.PermissionDenied, wantMsg: "enrolling node " + node.Name + " may only call methods open to enrolling nodes, not /curia.test.v1.Echo/Echo",
		},
		"enrolling node, method not in policy": {
			conn: asNode, method: echoMethod("Unlisted"),
			wantCode: codes.PermissionDenied, wantMsg: "enrolling node " + node.Name + " may only call",
		},
		"certificate of the CA, as before": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, admin) },
			method: echoMethod("Echo"), wantCode: codes.OK, wantMsg: "admin/alice:hello",
		},
		"certificate of the CA, kind not allowed": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dial(t, admin) },
			method: echoMethod("Register"), wantCode: codes.PermissionDenied, wantMsg: "principal admin/alice may not call /curia.test.v1.Echo/Register",
		},
		"certificate of the CA without spiffe URI": {
			conn:   func(t *testing.T) *grpc.ClientConn { return env.dialTLS(t, env.rawClientTLS(env.ca.keyPair(t))) },
			method: echoMethod("Echo"), wantCode: codes.Unauthenticated, wantMsg: "no spiffe:// URI SAN",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := callEcho(testContext(t), tc.conn(t), tc.method, "hello")
			wantCode(t, err, tc.wantCode, tc.wantMsg)
			if tc.wantCode == codes.OK && got != tc.wantMsg {
				t.Fatalf("reply %q, want %q", got, tc.wantMsg)
			}
		})
	}

	t.Run("streams and health are closed too", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testContext(t))
		defer cancel()
		_, err := openWatch(ctx, conn, node.Name)
		wantCode(t, err, codes.PermissionDenied, "enrolling node "+node.Name+" may only call")
		_, err = healthgrpc.NewHealthClient(conn).Check(ctx, &healthgrpc.HealthCheckRequest{})
		wantCode(t, err, codes.PermissionDenied, "enrolling node "+node.Name+" may only call")
	})
}

func TestServerEnrollingRefusesHandshake(t *testing.T) {
	var revoked sync.Map // serial number (string) → struct{}
	env := startServer(t, func(cfg *ServerConfig) {
		cfg.AllowEnrolling = true
		cfg.IsRevoked = func(c *x509.Certificate) bool {
			_, ok := revoked.Load(c.SerialNumber.String())
			return ok
		}
	})
	otherCA := newTestCA(t)
	key := newNodeKey(t)
	later := time.Now().Add(time.Hour)
	adminURI := admin.URI(testCluster).String()
	certPEM, keyPEM, serial := env.ca.issue(t, adminURI)
	revoked.Store(serial.String(), struct{}{})
	revokedCert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	withExtra := signed(t, key, nil, later)
	withExtra.Certificate = append(withExtra.Certificate, env.ca.cert.Raw)

	tests := map[string]struct {
		cfg      *tls.Config
		wantCode codes.Code
	}{
		"control: self-signed ed25519":             {env.rawClientTLS(signed(t, key, nil, later)), codes.OK},
		"self-signed ECDSA":                        {env.rawClientTLS(signed(t, newECDSAKey(t), nil, later)), codes.Unavailable},
		"expired self-signed ed25519":              {env.rawClientTLS(signed(t, key, nil, time.Now().Add(-time.Minute))), codes.Unavailable},
		"self-signed ed25519 with a second cert":   {env.rawClientTLS(withExtra), codes.Unavailable},
		"ed25519 certificate of another CA":        {env.rawClientTLS(signed(t, key, otherCA, later)), codes.Unavailable},
		"certificate of another CA, with identity": {env.rawClientTLS(otherCA.keyPair(t, adminURI)), codes.Unavailable},
		"revoked certificate of the CA":            {env.rawClientTLS(revokedCert), codes.Unavailable},
		"no client certificate":                    {env.rawClientTLS(), codes.Unavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := callEcho(testContext(t), env.dialTLS(t, tc.cfg), echoMethod("Register"), "hello")
			wantCode(t, err, tc.wantCode, "")
			t.Logf("result: %v", err)
		})
	}
	// Only the control reached the interceptors.
	if n := strings.Count(env.logs.String(), "finished call"); n != 1 {
		t.Fatalf("%d calls logged, want 1 (the control):\n%s", n, env.logs)
	}
}

// TestClientPrincipal checks the reasons behind the handshake failures above,
// which the client sees only as a TLS alert.
func TestClientPrincipal(t *testing.T) {
	ca, otherCA := newTestCA(t), newTestCA(t)
	creds := &Credentials{Cluster: testCluster, CAPool: poolOf(ca)}
	key := newNodeKey(t)
	later := time.Now().Add(time.Hour)
	revokedCert := ca.keyPair(t, admin.URI(testCluster).String())
	isRevoked := func(c *x509.Certificate) bool { return c.SerialNumber.Cmp(revokedCert.Leaf.SerialNumber) == 0 }
	chain := func(certs ...tls.Certificate) []*x509.Certificate {
		var out []*x509.Certificate
		for _, c := range certs {
			for _, der := range c.Certificate {
				cert, err := x509.ParseCertificate(der)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, cert)
			}
		}
		return out
	}

	tests := map[string]struct {
		certs   []*x509.Certificate
		want    pki.Principal
		wantErr string
	}{
		"certificate of the CA":       {certs: chain(ca.keyPair(t, admin.URI(testCluster).String())), want: admin},
		"self-signed ed25519":         {certs: chain(signed(t, key, nil, later)), want: enrolling(key)},
		"CA certificate, no identity": {certs: chain(ca.keyPair(t)), wantErr: "no spiffe:// URI SAN"},
		"revoked":                     {certs: chain(revokedCert), wantErr: "is revoked"},
		"self-signed ECDSA":           {certs: chain(signed(t, newECDSAKey(t), nil, later)), wantErr: "has a ECDSA key, want ed25519"},
		"expired":                     {certs: chain(signed(t, key, nil, time.Now().Add(-time.Minute))), wantErr: "not now"},
		"self-signed with another":    {certs: chain(signed(t, key, nil, later), signed(t, key, nil, later)), wantErr: "2 certificates, want one self-signed certificate alone"},
		"ed25519 of another CA":       {certs: chain(signed(t, key, otherCA, later)), wantErr: "certificate signed by unknown authority"},
		"another CA's, with identity": {certs: chain(otherCA.keyPair(t, admin.URI(testCluster).String())), wantErr: "certificate signed by unknown authority"},
		"none":                        {wantErr: "no certificate presented"},
	}
	v := newClientVerifier(creds, isRevoked)
	for name, tc := range tests {
		// Once verified, again from what the verifier remembers: the
		// same answer.
		for _, call := range []string{"first", "again"} {
			t.Run(name+"/"+call, func(t *testing.T) { checkClientPrincipal(t, v, name, tc.certs, tc.want, tc.wantErr) })
		}
	}
}

func checkClientPrincipal(t *testing.T, v *clientVerifier, name string, certs []*x509.Certificate, want pki.Principal, wantErr string) {
	t.Helper()
	got, err := v.principal(certs)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("principal = %v, %v; want error containing %q", got, err, wantErr)
		}
		// Only a CA certificate without identity passes the
		// handshake, for the authorizer to explain.
		if noIdentity := errors.Is(err, pki.ErrNoIdentity); noIdentity != (name == "CA certificate, no identity") {
			t.Fatalf("errors.Is(%v, ErrNoIdentity) = %v", err, noIdentity)
		}
		return
	}
	if err != nil || got != want {
		t.Fatalf("principal = %v, %v; want %v", got, err, want)
	}
}

// TestRememberedChainRechecked: a chain of the CA the verifier remembers
// is still refused once its leaf is revoked, or once a certificate in it
// is no longer valid; what it skips is the signatures alone.
func TestRememberedChainRechecked(t *testing.T) {
	ca := newTestCA(t)
	creds := &Credentials{Cluster: testCluster, CAPool: poolOf(ca)}
	pair := ca.keyPair(t, admin.URI(testCluster).String())
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	revoked := false
	v := newClientVerifier(creds, func(*x509.Certificate) bool { return revoked })
	certs := []*x509.Certificate{leaf}
	if got, err := v.principal(certs); err != nil || got != admin {
		t.Fatalf("first call: %v, %v; want %v", got, err, admin)
	}
	revoked = true
	if _, err := v.principal(certs); err == nil || !strings.Contains(err.Error(), "is revoked") {
		t.Fatalf("after the revocation: %v, want revoked", err)
	}
	revoked = false
	v.now = func() time.Time { return leaf.NotAfter.Add(time.Second) }
	if got, err := v.principal(certs); err == nil {
		t.Fatalf("after the leaf expired: %v, want refused", got)
	}
}

func TestDialEnrolling(t *testing.T) {
	env := startServer(t, func(cfg *ServerConfig) { cfg.AllowEnrolling = true })
	plain := startServer(t, nil) // AllowEnrolling false
	other := newTestCA(t)
	key := newNodeKey(t)
	ctx := testContext(t)

	for name, tc := range map[string]struct {
		addr     string
		caPEM    []byte
		kinds    []pki.Kind
		wantCode codes.Code
		wantMsg  string
	}{
		"control":                  {addr: env.addr, caPEM: env.ca.pem, kinds: []pki.Kind{pki.KindCurator}, wantCode: codes.OK},
		"server of the wrong kind": {addr: env.addr, caPEM: env.ca.pem, kinds: []pki.Kind{pki.KindConsensus}, wantCode: codes.Unavailable, wantMsg: "server is curator, want one of [consensus]"},
		"server of another CA":     {addr: env.addr, caPEM: other.pem, wantCode: codes.Unavailable, wantMsg: "certificate signed by unknown authority"},
		"enrolling not allowed":    {addr: plain.addr, caPEM: plain.ca.pem, wantCode: codes.Unavailable},
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := DialEnrolling(tc.addr, tc.caPEM, key, tc.kinds)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			got, err := callEcho(ctx, conn, echoMethod("Register"), "hello")
			wantCode(t, err, tc.wantCode, tc.wantMsg)
			if want := enrolling(key).String() + ":hello"; tc.wantCode == codes.OK && got != want {
				t.Fatalf("reply %q, want %q", got, want)
			}
		})
	}

	if _, err := DialEnrolling(env.addr, []byte("no PEM"), key, nil); err == nil {
		t.Error("DialEnrolling accepted a CA without certificates")
	}
	if _, err := DialEnrolling(env.addr, env.ca.pem, key[:5], nil); err == nil {
		t.Error("DialEnrolling accepted a truncated key")
	}
}

// TestEnrollingClientVerifiesServer covers the servers TestDialEnrolling
// cannot start: an enrolling node takes the cluster's name from the server's
// certificate, and nothing else.
func TestEnrollingClientVerifiesServer(t *testing.T) {
	ca, otherCA := newTestCA(t), newTestCA(t)
	cfg := enrollingClientTLSConfig(signed(t, newNodeKey(t), nil, time.Now().Add(time.Hour)), poolOf(ca), []pki.Kind{pki.KindCurator})
	tests := map[string]struct {
		server  tls.Certificate
		wantErr string
	}{
		"curator":                     {server: ca.keyPair(t, curator.URI(testCluster).String())},
		"curator of any cluster name": {server: ca.keyPair(t, "spiffe://other.cluster/curator")},
		"wrong kind":                  {server: ca.keyPair(t, admin.URI(testCluster).String()), wantErr: "server is admin/alice, want one of [curator]"},
		"no identity":                 {server: ca.keyPair(t), wantErr: "no spiffe:// URI SAN"},
		"two identities":              {server: ca.keyPair(t, curator.URI(testCluster).String(), "spiffe://other.cluster/curator"), wantErr: "2 spiffe:// URI SANs"},
		"port in the trust domain":    {server: ca.keyPair(t, "spiffe://test.curia:443/curator"), wantErr: `belongs to cluster "test.curia:443"`},
		"not canonical":               {server: ca.keyPair(t, "spiffe://test.curia/curator?x=1"), wantErr: "not in canonical form"},
		"another CA":                  {server: otherCA.keyPair(t, curator.URI(testCluster).String()), wantErr: "certificate signed by unknown authority"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := cfg.VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.server.Leaf}})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("VerifyConnection = %v, want error %q", err, tc.wantErr)
			}
		})
	}
}
