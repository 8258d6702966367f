package roleserve

import (
	"crypto/ed25519"
	"testing"
	"testing/synctest"
	"time"

	"curia.dev/platform/pki"
)

// TestRoleMemberDue: the role's member certificate replaces the one the
// local consensus holds when that one was issued before it, even when both
// expire at the same instant (the CA's expiry cuts both); never the other
// way round, and never for another key.
func TestRoleMemberDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca, err := pki.NewCA("test.curia", 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _ := ed25519.GenerateKey(nil)
		other, _, _ := ed25519.GenerateKey(nil)
		issue := func(key ed25519.PublicKey) []byte {
			t.Helper()
			// 30 days asked, cut to the CA's day.
			c, err := ca.Issue(pki.IssueRequest{Cluster: "test.curia", Principal: pki.Principal{Kind: pki.KindMember, Name: "node-0123456789abcdef0123456789abcdef"}, PublicKey: key, Validity: 30 * 24 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			return c.CertPEM
		}
		removed := issue(pub) // the member removed while the agent was down
		time.Sleep(time.Minute)
		givenBack := issue(pub) // the role given back: a new member
		time.Sleep(time.Minute)
		renewed := issue(pub) // a renewal the agent installed later
		forOther := issue(other)
		a, _ := pki.ParseCertPEM(removed)
		b, _ := pki.ParseCertPEM(givenBack)
		if !a.NotAfter.Equal(b.NotAfter) {
			t.Fatalf("the fixture wants both cut to the CA's expiry: %v, %v", a.NotAfter, b.NotAfter)
		}
		now := time.Now()
		for name, tc := range map[string]struct {
			role, installed []byte
			want            bool
		}{
			"none installed":                        {role: givenBack, want: true},
			"issued before the role's, same expiry": {role: givenBack, installed: removed, want: true},
			"the role's own":                        {role: givenBack, installed: givenBack, want: false},
			"a renewal issued after the role's":     {role: givenBack, installed: renewed, want: false},
			"installed of another key":              {role: givenBack, installed: forOther, want: true},
			"the role's of another key":             {role: forOther, installed: removed, want: false},
			"no role certificate":                   {installed: removed, want: false},
		} {
			if got := roleMemberDue(tc.role, tc.installed, pub, now); got != tc.want {
				t.Errorf("%s: due %v, want %v", name, got, tc.want)
			}
		}
		if roleMemberDue(givenBack, removed, pub, now.Add(48*time.Hour)) {
			t.Error("an expired role certificate is due")
		}
	})
}
