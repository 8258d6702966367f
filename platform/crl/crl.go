// Package crl enforces the cluster's certificate revocation list. A Watcher
// holds the newest list that verifies against the cluster CA and answers "is
// this certificate revoked?" for the gRPC servers' handshakes and calls. It
// is fed from etcd (keys.CRL, which the curator writes; Run) where a process
// has etcd access, and from the curator's WatchCRL stream (Follow) where it
// has not; both may feed one watcher, since it never steps back to an older
// list.
//
//	curator ─ revoke: new CRL ─▶ etcd keys.CRL ──Run──▶ Watcher ◀──Follow── curator WatchCRL
//	                                                      │
//	                                   IsRevoked (handshake, every call), Changed (etcd's CRL file)
package crl

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/run"
)

// ErrOlder is Set's error for a list older than the one held.
var ErrOlder = errors.New("CRL older than the one held")

// Watcher holds the newest valid CRL seen.
type Watcher struct {
	cas []*x509.Certificate
	log *slog.Logger

	mu      sync.RWMutex
	revoked map[string]bool // serial numbers, hex
	number  *big.Int
	pem     []byte
	der     []byte
	issuer  *x509.Certificate
	// changed is closed (and replaced) whenever a newer list is loaded.
	changed chan struct{}
	// heard is closed once a list came from the curators (Follow) that is
	// not older than the one held.
	heard     chan struct{}
	heardOnce sync.Once
	// curatorsBehind is the number of the curators' last list when it was
	// older than the one held, nil otherwise.
	curatorsBehind *big.Int
}

// New returns a watcher that trusts CRLs signed by any of cas (the trust
// bundle: during a CA rotation, the old CA and the new). A list of either
// revokes by serial (serials are random, 128 bits); the issuing CA re-signs
// the list when it changes, so it carries the old CA's revocations over.
func New(cas []*x509.Certificate, log *slog.Logger) *Watcher {
	return &Watcher{cas: cas, log: log, revoked: map[string]bool{}, changed: make(chan struct{}), heard: make(chan struct{})}
}

// Heard is closed once the curators' stream (Follow) delivered a valid
// list at least as new as the one held: from then on the list held is the
// curators' or newer. A process that restarts from what it kept on disk
// waits for it (a bounded time) before trusting its own list. A list older
// than the one held does not close it (CuratorsBehind): the cluster's state
// stepped back (etcd restored or recovered from an older state), and a
// revocation made since may be numbered below the list held (issue 29, N2).
func (w *Watcher) Heard() <-chan struct{} { return w.heard }

// CuratorsBehind is the number of the curators' last list and of the one
// held when the curators' was older, nils otherwise.
func (w *Watcher) CuratorsBehind() (theirs, held *big.Int) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.curatorsBehind == nil {
		return nil, nil
	}
	return w.curatorsBehind, w.number
}

// Issuer is the CA that signed the list held (nil before any): the CA the
// curators issue with (roleserve renews certificates of another).
func (w *Watcher) Issuer() *x509.Certificate {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.issuer
}

// IsRevoked reports whether cert is on the current list. It fits
// rpc.ServerConfig.IsRevoked.
func (w *Watcher) IsRevoked(cert *x509.Certificate) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.revoked[cert.SerialNumber.Text(16)] && !failpoint.Mutated(failpoint.NoCRLCheck)
}

// Set loads a PEM CRL. A list that does not verify against the CA, or is
// older than the one held, is refused and the held one stays. It reports
// whether the list is newer than the one held.
func (w *Watcher) Set(pemCRL []byte) (bool, error) {
	newer, _, err := w.set(pemCRL)
	return newer, err
}

// set is Set, which also returns the list's number (nil if it does not
// verify).
func (w *Watcher) set(pemCRL []byte) (bool, *big.Int, error) {
	list, issuer, err := pki.VerifyCRLOf(pemCRL, w.cas)
	if err != nil {
		return false, nil, fmt.Errorf("CRL: %w", err)
	}
	revoked := make(map[string]bool, len(list.RevokedCertificateEntries))
	for _, e := range list.RevokedCertificateEntries {
		revoked[e.SerialNumber.Text(16)] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.number != nil {
		switch list.Number.Cmp(w.number) {
		case -1:
			return false, list.Number, fmt.Errorf("%w: number %s, the held one is %s", ErrOlder, list.Number, w.number)
		case 0:
			return false, list.Number, nil
		}
	}
	w.revoked, w.number, w.pem, w.der, w.issuer = revoked, list.Number, pemCRL, list.Raw, issuer
	close(w.changed)
	w.changed = make(chan struct{})
	return true, list.Number, nil
}

// Current returns the list held (PEM and DER; nil before any), its number
// (nil before any), and a channel closed when a newer one is loaded.
func (w *Watcher) Current() (pem, der []byte, number *big.Int, changed <-chan struct{}) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.pem, w.der, w.number, w.changed
}

// Run follows keys.CRL through cli until ctx ends or the client closes.
func (w *Watcher) Run(ctx context.Context, cli *clientv3.Client) error {
	for ctx.Err() == nil && cli.Ctx().Err() == nil {
		resp, err := cli.Get(ctx, keys.CRL)
		if err != nil {
			w.log.Warn("read CRL", "err", err)
			run.Sleep(ctx, time.Second)
			continue
		}
		if len(resp.Kvs) > 0 {
			_, _ = w.load(resp.Kvs[0].Value, "etcd")
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cli.Watch(wctx, keys.CRL, clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					_, _ = w.load(ev.Kv.Value, "etcd")
				}
			}
		}
		cancel()
		run.Sleep(ctx, 100*time.Millisecond)
	}
	return nil
}

// Follow follows the curators' WatchCRL stream until ctx ends, opening it
// again (after a second, on the client cur returns then) whenever it
// breaks. It fits run.Group.
func (w *Watcher) Follow(ctx context.Context, cur func() (curatorv1.CuratorClient, error)) error {
	for ctx.Err() == nil {
		c, err := cur()
		if err == nil {
			err = w.followOnce(ctx, c)
		}
		if ctx.Err() != nil {
			return nil
		}
		w.log.Debug("CRL stream from the curators broke; opening it again", "err", err)
		run.Sleep(ctx, time.Second)
	}
	return nil
}

func (w *Watcher) followOnce(ctx context.Context, cur curatorv1.CuratorClient) error {
	stream, err := cur.WatchCRL(ctx, &curatorv1.WatchCRLRequest{})
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("the curator ended the stream")
		}
		if err != nil {
			return err
		}
		if len(resp.GetCrl()) == 0 {
			continue
		}
		number, err := w.load(resp.GetCrl(), "curator")
		w.mu.Lock()
		w.curatorsBehind = nil
		if errors.Is(err, ErrOlder) {
			w.curatorsBehind = number
		}
		w.mu.Unlock()
		if err == nil {
			w.heardOnce.Do(func() { close(w.heard) })
		}
	}
}

// load sets a list from a source, and returns its number (nil if it does
// not verify) and Set's error.
func (w *Watcher) load(pemCRL []byte, from string) (*big.Int, error) {
	newer, number, err := w.set(pemCRL)
	if err != nil {
		w.log.Error("refusing CRL", "from", from, "err", err)
		return number, err
	}
	if newer {
		w.mu.RLock()
		w.log.Info("CRL loaded", "from", from, "number", w.number, "revoked", len(w.revoked))
		w.mu.RUnlock()
	}
	return number, nil
}
