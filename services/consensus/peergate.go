package consensus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp"

	"curia.dev/platform/crl"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/pki"
)

// The peer gate owns etcd's peer port (issue 29, N3). etcd checks a
// peer's certificate, and the revocation list, only when a connection is
// opened; a member whose certificate is revoked (its node deleted) keeps
// the connections it holds, and through them renews leases, promotes
// learners and sends raft messages. So etcd serves its peer API on a unix
// socket only this process can reach, and the gate listens on --listen-peer
// in its place: it does the TLS handshake etcd would do (the cluster CA,
// a member certificate, the address its certificate names, the revocation
// list), then copies bytes between the connection and the socket. It
// keeps every connection with its certificate, and when the revocation
// list changes, it closes those whose certificate is now revoked.
//
// Our own member's connections to others are etcd's (dialled with the
// member certificate); a revoked member's port answers them until the
// member is removed, which ends them in etcd. What the gate closes is what
// a revoked member sends on connections it opened.

// peerHandshakeTimeout bounds a peer's TLS handshake.
const peerHandshakeTimeout = 10 * time.Second

// peerGate accepts etcd peer connections and forwards them to etcd.
type peerGate struct {
	lis    net.Listener
	socket string // etcd's peer socket
	tls    *tls.Config
	crl    *crl.Watcher
	log    *slog.Logger

	mu    sync.Mutex
	conns map[*gatedConn]struct{}
}

// gatedConn is one forwarded peer connection.
type gatedConn struct {
	cert     *x509.Certificate
	outer    net.Conn // the peer's TLS connection
	inner    net.Conn // to etcd's socket
	closeOne sync.Once
}

func (c *gatedConn) close() {
	c.closeOne.Do(func() {
		c.outer.Close()
		c.inner.Close()
	})
}

// peerSocket is where etcd's peer API listens: in the data directory, or,
// when that path is too long for a unix socket (108 bytes on Linux), in a
// private directory of its own under the temporary directory (temp, for
// the process to remove when it ends).
func peerSocket(dataDir string) (path, temp string, err error) {
	p, err := filepath.Abs(filepath.Join(dataDir, "peer.sock"))
	if err != nil {
		return "", "", err
	}
	if len(p) < 100 {
		return p, "", nil
	}
	dir, err := os.MkdirTemp("", "curia-peer-")
	if err != nil {
		return "", "", fmt.Errorf("a directory for etcd's peer socket (%s is too long a path): %w", p, err)
	}
	return filepath.Join(dir, "peer.sock"), dir, nil
}

// newPeerGate listens on addr. certFile and keyFile are read for every
// handshake, so a renewed member certificate is used at once; a node
// without one yet refuses every peer.
func newPeerGate(addr, socket string, trusted *x509.CertPool, certFile, keyFile string, revocations *crl.Watcher, log *slog.Logger) (*peerGate, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on the peer address %s: %w", addr, err)
	}
	g := &peerGate{lis: lis, socket: socket, crl: revocations, log: log, conns: map[*gatedConn]struct{}{}}
	g.tls = &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  trusted,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("no member certificate: %w", err)
			}
			return &c, nil
		},
		// VerifyConnection, not VerifyPeerCertificate: it runs on resumed
		// sessions too, after the chain was verified.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no client certificate")
			}
			return g.admit(cs.PeerCertificates[0])
		},
	}
	return g, nil
}

// admit refuses a certificate that is not a member's, or is revoked.
func (g *peerGate) admit(cert *x509.Certificate) error {
	if cert.Subject.CommonName != string(pki.KindMember) {
		return fmt.Errorf("certificate %q is not a member's", cert.Subject.CommonName)
	}
	if g.crl.IsRevoked(cert) {
		return fmt.Errorf("certificate %s is revoked", cert.SerialNumber.Text(16))
	}
	return nil
}

// revoked says whether an established connection's certificate is revoked
// now.
func (g *peerGate) revoked(cert *x509.Certificate) bool {
	if failpoint.Mutated(failpoint.NoPeerCut) {
		return false
	}
	return g.crl.IsRevoked(cert)
}

// run serves until ctx ends.
func (g *peerGate) run(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		g.lis.Close()
	}()
	go g.cutRevoked(ctx)
	for {
		conn, err := g.lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				g.closeAll()
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("peer gate: %w", err)
		}
		go g.serve(ctx, conn)
	}
}

// serve does the handshake and forwards one connection until either side
// ends it.
func (g *peerGate) serve(ctx context.Context, conn net.Conn) {
	tc := tls.Server(conn, g.tls)
	hctx, cancel := context.WithTimeout(ctx, peerHandshakeTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		g.log.Debug("peer handshake refused", "from", conn.RemoteAddr().String(), "err", err)
		conn.Close()
		return
	}
	cert := tc.ConnectionState().PeerCertificates[0]
	if err := checkPeerAddress(ctx, cert, conn.RemoteAddr()); err != nil {
		g.log.Warn("peer refused", "from", conn.RemoteAddr().String(), "err", err)
		tc.Close()
		return
	}
	inner, err := net.Dial("unix", g.socket)
	if err != nil {
		// etcd does not run on this node now.
		g.log.Debug("peer connection with no etcd to forward to", "from", conn.RemoteAddr().String(), "err", err)
		tc.Close()
		return
	}
	c := &gatedConn{cert: cert, outer: tc, inner: inner}
	g.mu.Lock()
	g.conns[c] = struct{}{}
	g.mu.Unlock()
	// A revocation that came between the handshake and now.
	if g.revoked(cert) {
		c.close()
	}
	done := make(chan struct{}, 2)
	outer := timeoutConn{tc}
	go func() { _, _ = io.Copy(inner, outer); done <- struct{}{} }()
	go func() { _, _ = io.Copy(outer, inner); done <- struct{}{} }()
	<-done
	c.close()
	<-done
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// timeoutConn bounds each write to a peer as etcd's own peer listener
// does: raft streams carry a heartbeat more often than that, so a peer
// that stops reading (frozen, partitioned) is dropped. Reads are not
// bounded: on a stream the peer opened, it sends nothing after its
// request while etcd writes to it (bounding reads would close every idle
// direction, and etcd's strict reconfiguration check counts a peer whose
// streams keep reconnecting as not connected).
type timeoutConn struct{ net.Conn }

func (c timeoutConn) Write(b []byte) (int, error) {
	_ = c.SetWriteDeadline(time.Now().Add(rafthttp.ConnWriteTimeout))
	return c.Conn.Write(b)
}

// cutRevoked closes the connections of every certificate the revocation
// list revokes, each time it changes, until ctx ends.
func (g *peerGate) cutRevoked(ctx context.Context) {
	for {
		_, _, _, changed := g.crl.Current()
		g.mu.Lock()
		var cut []*gatedConn
		for c := range g.conns {
			if g.revoked(c.cert) {
				cut = append(cut, c)
			}
		}
		g.mu.Unlock()
		for _, c := range cut {
			g.log.Warn("closing the peer connection of a revoked certificate", "from", c.outer.RemoteAddr().String(), "serial", c.cert.SerialNumber.Text(16))
			c.close()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

func (g *peerGate) closeAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for c := range g.conns {
		c.close()
	}
}

// checkPeerAddress requires a peer's certificate to name the address it
// connects from, as etcd's own peer port does: one of its IP addresses,
// or a DNS name that resolves to it. A member certificate works only from
// its member's host.
func checkPeerAddress(ctx context.Context, cert *x509.Certificate, from net.Addr) error {
	host, _, err := net.SplitHostPort(from.String())
	if err != nil {
		return err
	}
	ip := net.ParseIP(host)
	if slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
		return nil
	}
	for _, name := range cert.DNSNames {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := net.DefaultResolver.LookupIPAddr(lctx, name)
		cancel()
		if err == nil && slices.ContainsFunc(addrs, func(a net.IPAddr) bool { return a.IP.Equal(ip) }) {
			return nil
		}
	}
	return fmt.Errorf("certificate %s names neither %s nor a name that resolves to it (IPs %v, names %v)", cert.SerialNumber.Text(16), host, cert.IPAddresses, cert.DNSNames)
}
