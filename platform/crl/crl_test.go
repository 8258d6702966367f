package crl

import (
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"testing"
	"time"

	"curia.dev/platform/pki"
)

func TestWatcherSet(t *testing.T) {
	ca, err := pki.NewCA("test.curia", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func() *x509.Certificate {
		iss, err := ca.Issue(pki.IssueRequest{Cluster: "test.curia", Principal: pki.Principal{Kind: pki.KindCurator}, Validity: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return iss.Cert
	}
	kept, gone := issue(), issue()
	crl := func(signer *pki.CA, number int64, revoked ...*x509.Certificate) []byte {
		var entries []x509.RevocationListEntry
		for _, c := range revoked {
			entries = append(entries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: time.Now()})
		}
		pem, err := signer.CRL(entries, big.NewInt(number), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return pem
	}
	w := New([]*x509.Certificate{ca.Cert}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if w.IsRevoked(gone) {
		t.Fatal("revoked before any CRL")
	}
	if _, err := w.Set(crl(ca, 2, gone)); err != nil {
		t.Fatal(err)
	}
	if !w.IsRevoked(gone) || w.IsRevoked(kept) {
		t.Fatalf("after CRL: gone revoked=%v, kept revoked=%v", w.IsRevoked(gone), w.IsRevoked(kept))
	}

	other, err := pki.NewCA("test.curia", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Set(crl(other, 3)); err == nil {
		t.Fatal("a CRL of another CA was accepted")
	}
	if _, err := w.Set(crl(ca, 1)); !errors.Is(err, ErrOlder) {
		t.Fatalf("an older CRL: %v", err)
	}
	if !w.IsRevoked(gone) {
		t.Fatal("a refused CRL replaced the held one")
	}
}
