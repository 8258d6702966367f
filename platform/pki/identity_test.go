package pki

import (
	"crypto/ed25519"
	"errors"
	"net/url"
	"testing"
	"time"
)

func TestParsePrincipal(t *testing.T) {
	for in, want := range map[string]Principal{
		"curator":                       {Kind: KindCurator},
		"reconciler":                    {Kind: KindReconciler},
		"admin/alice":                   {Kind: KindAdmin, Name: "alice"},
		"node/" + testNodeID:            {Kind: KindNode, Name: testNodeID},
		"consensus/" + testNodeID:       {Kind: KindConsensus, Name: testNodeID},
		"curator/":                      {}, // errors below
		"admin/":                        {},
		"admin":                         {},
		"admin/Alice":                   {},
		"admin/a/b":                     {},
		"node/node-1234":                {},
		"consensus/" + testNodeID + "/": {},
		"":                              {},
		"enrolling/" + testNodeID:       {}, // never a certificate identity
		"enrolling":                     {},
	} {
		t.Run(in, func(t *testing.T) {
			got, err := ParsePrincipal(in)
			if want == (Principal{}) {
				if err == nil {
					t.Fatalf("ParsePrincipal(%q) = %v, want error", in, got)
				}
				return
			}
			if err != nil || got != want {
				t.Fatalf("ParsePrincipal(%q) = %v, %v; want %v", in, got, err, want)
			}
			if got.String() != in {
				t.Errorf("String() = %q, want %q", got.String(), in)
			}
			// The URI form round-trips too.
			u, err := url.Parse(got.URI(testCluster).String())
			if err != nil {
				t.Fatal(err)
			}
			if back, err := PrincipalFromURI(u, testCluster); err != nil || back != want {
				t.Errorf("PrincipalFromURI(%v) = %v, %v", u, back, err)
			}
		})
	}
}

func TestParseForwarded(t *testing.T) {
	for in, want := range map[string]Principal{
		"enrolling/" + testNodeID:        {Kind: KindEnrolling, Name: testNodeID},
		"admin/alice":                    {Kind: KindAdmin, Name: "alice"},
		"node/" + testNodeID:             {Kind: KindNode, Name: testNodeID},
		"curator":                        {Kind: KindCurator},
		"enrolling":                      {}, // errors below
		"enrolling/":                     {},
		"enrolling/node-1234":            {},
		"enrolling/" + testNodeID + "/x": {},
		"enrolling/alice":                {},
		"admin/":                         {},
		"root":                           {},
		"":                               {},
	} {
		t.Run(in, func(t *testing.T) {
			got, err := ParseForwarded(in)
			if want == (Principal{}) {
				if err == nil {
					t.Fatalf("ParseForwarded(%q) = %v, want error", in, got)
				}
				return
			}
			if err != nil || got != want {
				t.Fatalf("ParseForwarded(%q) = %v, %v; want %v", in, got, err, want)
			}
			if got.String() != in {
				t.Errorf("String() = %q, want %q", got.String(), in)
			}
		})
	}
}

func TestEnrollingIsNoCertificateIdentity(t *testing.T) {
	p := Principal{Kind: KindEnrolling, Name: testNodeID}
	if err := p.Validate(); err == nil {
		t.Error("Validate accepted an enrolling principal")
	}
	if got, err := PrincipalFromURI(p.URI(testCluster), testCluster); !errors.Is(err, ErrNoIdentity) {
		t.Errorf("PrincipalFromURI(%v) = %v, %v; want ErrNoIdentity", p.URI(testCluster), got, err)
	}
	// Nor can the CA be made to issue one.
	ca := newTestCA(t, testCluster)
	if _, err := ca.Issue(IssueRequest{Cluster: testCluster, Principal: p, Validity: time.Hour}); err == nil {
		t.Error("Issue issued an enrolling principal")
	}
}

func TestNodeID(t *testing.T) {
	pub := make(ed25519.PublicKey, ed25519.PublicKeySize)
	for i := range pub {
		pub[i] = byte(i)
	}
	if got, want := NodeID(pub), "node-000102030405060708090a0b0c0d0e0f"; got != want {
		t.Errorf("NodeID = %q, want %q", got, want)
	}
}
