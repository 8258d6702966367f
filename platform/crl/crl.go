// Package crl enforces the cluster's certificate revocation list: it follows
// keys.CRL in etcd (written by the curator when it deletes a node), checks
// the list's signature against the cluster CA, and answers "is this
// certificate revoked?" for the gRPC servers' handshakes and calls.
package crl

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/run"
)

// Watcher holds the newest valid CRL seen.
type Watcher struct {
	ca  *x509.Certificate
	log *slog.Logger

	mu      sync.RWMutex
	revoked map[string]bool // serial numbers, hex
	number  *big.Int
}

// New returns a watcher that trusts CRLs signed by ca.
func New(ca *x509.Certificate, log *slog.Logger) *Watcher {
	return &Watcher{ca: ca, log: log, revoked: map[string]bool{}}
}

// IsRevoked reports whether cert is on the current list. It fits
// rpc.ServerConfig.IsRevoked.
func (w *Watcher) IsRevoked(cert *x509.Certificate) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.revoked[cert.SerialNumber.Text(16)]
}

// Set loads a PEM CRL. A list that does not verify against the CA, or is
// older than the one held, is refused and the held one stays.
func (w *Watcher) Set(pemCRL []byte) error {
	list, err := pki.VerifyCRL(pemCRL, w.ca)
	if err != nil {
		return fmt.Errorf("CRL: %w", err)
	}
	revoked := make(map[string]bool, len(list.RevokedCertificateEntries))
	for _, e := range list.RevokedCertificateEntries {
		revoked[e.SerialNumber.Text(16)] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.number != nil && list.Number.Cmp(w.number) < 0 {
		return fmt.Errorf("CRL number %s is older than the held %s", list.Number, w.number)
	}
	w.revoked, w.number = revoked, list.Number
	return nil
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
			w.load(resp.Kvs[0].Value)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cli.Watch(wctx, keys.CRL, clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					w.load(ev.Kv.Value)
				}
			}
		}
		cancel()
		run.Sleep(ctx, 100*time.Millisecond)
	}
	return nil
}

func (w *Watcher) load(pemCRL []byte) {
	if err := w.Set(pemCRL); err != nil {
		w.log.Error("refusing CRL", "err", err)
		return
	}
	w.mu.RLock()
	w.log.Info("CRL loaded", "number", w.number, "revoked", len(w.revoked))
	w.mu.RUnlock()
}
