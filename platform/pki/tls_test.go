package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func tlsCert(t *testing.T, iss *Issued) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(iss.CertPEM, iss.KeyPEM)
	if err != nil {
		t.Fatalf("X509KeyPair: %v", err)
	}
	return c
}

// handshake runs one TLS connection over loopback and returns the principals
// each side saw, or the first error.
func handshake(t *testing.T, server, client *tls.Config) (serverSaw, clientSaw Principal, err error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	type result struct {
		p   Principal
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			done <- result{err: err}
			return
		}
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		st := tc.ConnectionState()
		if st.Version != tls.VersionTLS13 {
			done <- result{err: errors.New("server: not TLS 1.3")}
			return
		}
		p, err := PrincipalFromCert(st.PeerCertificates[0], testCluster)
		// Reply so the client sees the server accept it (TLS 1.3 client
		// certificate failures surface only on the client's first read).
		if err == nil {
			_, err = tc.Write([]byte("ok"))
		}
		done <- result{p: p, err: err}
	}()

	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(&d, "tcp", ln.Addr().String(), client)
	if err == nil {
		defer conn.Close()
		err = conn.SetDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 2)
		if err == nil {
			_, err = io.ReadFull(conn, buf)
		}
		if err == nil {
			clientSaw, err = PrincipalFromCert(conn.ConnectionState().PeerCertificates[0], testCluster)
		}
	}
	ln.Close() // unblocks Accept if the client never got that far
	r := <-done
	if err == nil {
		err = r.err
	}
	return r.p, clientSaw, err
}

func TestMutualTLS13(t *testing.T) {
	ca := newTestCA(t, testCluster)
	other := newTestCA(t, testCluster)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)

	serverIss := issue(t, ca, allPrincipals["curator"])
	serverCfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{tlsCert(t, serverIss)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	clientCfg := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{
			MinVersion:   tls.VersionTLS13,
			RootCAs:      pool,
			ServerName:   "localhost",
			Certificates: certs,
		}
	}

	for name, p := range allPrincipals {
		t.Run(name, func(t *testing.T) {
			serverSaw, clientSaw, err := handshake(t, serverCfg, clientCfg(tlsCert(t, issue(t, ca, p))))
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			if serverSaw != p || clientSaw != allPrincipals["curator"] {
				t.Errorf("server saw %v (want %v), client saw %v (want curator)", serverSaw, p, clientSaw)
			}
		})
	}

	for name, cfg := range map[string]*tls.Config{
		"no client certificate":            clientCfg(),
		"client certificate of another CA": clientCfg(tlsCert(t, issue(t, other, allPrincipals["admin"]))),
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := handshake(t, serverCfg, cfg); err == nil {
				t.Fatal("handshake succeeded, want refusal")
			}
		})
	}
}
