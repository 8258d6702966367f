package curator_test

import (
	"context"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/snapshots"
	cut "curia.dev/services/curator/curatortest"
)

// TestCRLAfterRestore (issue 29, N2): etcd restored from a snapshot taken
// before node A's deletion holds an older CRL than every process; the next
// revocation (node B's deletion) is numbered past the newest list held and
// keeps A's revocation, so B's certificate is refused and A's stays
// refused.
func TestCRLAfterRestore(t *testing.T) {
	if err := revokeAfterRestore(t); err != nil {
		t.Fatal(err)
	}
}

// TestCRLAfterRestoreMutations: with the numbering from etcd alone, or
// without the union of the stored and the held list, TestCRLAfterRestore's
// assertion fails.
func TestCRLAfterRestoreMutations(t *testing.T) {
	for _, m := range []string{failpoint.CRLNumberFromEtcd, failpoint.NoCRLUnion} {
		t.Run(m, func(t *testing.T) {
			t.Setenv("CURIA_MUTATIONS", m)
			err := revokeAfterRestore(t)
			if err == nil {
				t.Fatalf("mutation %s switched the mechanism off, and the assertion still held", m)
			}
			t.Logf("as expected: %v", err)
		})
	}
}

// revokeAfterRestore deletes node A after a snapshot, puts the snapshot's
// CRL back into etcd (the key as a restore of the snapshot brings it
// back), deletes node B and returns what is wrong with the revocations
// then in force; it fails the test for everything else.
func revokeAfterRestore(t *testing.T) error {
	t.Helper()
	dir := t.TempDir()
	c := cut.New(t, 1, "--snapshot-dir", dir, "--snapshot-interval", "0")
	ctx := ctxT(t)
	m := c.Management()
	a, b := c.NewAgent(), c.NewAgent()
	a.Enrol(ctx)
	b.Enrol(ctx)

	snap, err := m.TakeSnapshot(ctx, &curatorv1.TakeSnapshotRequest{Reason: "the test restores its CRL"})
	if err != nil {
		t.Fatal(err)
	}
	delA, err := m.DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: a.ID, SafetyBypassNotDecommissioned: true})
	if err != nil {
		t.Fatal(err)
	}
	// Every curator holds the list that revokes A before etcd steps back.
	var afterA *big.Int
	pollUntil(t, 10*time.Second, func() error {
		n, revoked, err := servedCRL(ctx, c)
		if err != nil {
			return err
		}
		for _, s := range delA.RevokedSerials {
			if !revoked[s] {
				return fmt.Errorf("CRL %v does not revoke %s yet", n, s)
			}
		}
		if !refused(ctx, c, a) {
			return fmt.Errorf("A's certificate still works (CRL %v)", n)
		}
		afterA = n
		return nil
	})

	// The restore: the CRL key as the snapshot has it (older, without A).
	db := filepath.Join(dir, snap.Snapshot.Name+snapshots.DBExt)
	if _, err := os.Stat(db); err != nil {
		t.Fatal(err)
	}
	old, err := restore(t, db).Get(ctx, keys.CRL)
	if err != nil || len(old.Kvs) != 1 {
		t.Fatalf("the snapshot's CRL: %v (%v)", old, err)
	}
	oldList, err := pki.ParseCRL(old.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if oldList.Number.Cmp(afterA) >= 0 {
		t.Fatalf("the snapshot's CRL is number %v, the one held %v: want an older one", oldList.Number, afterA)
	}
	cli := c.Etcd(c.Voters[0].ClientURL)
	if _, err := cli.Put(ctx, keys.CRL, string(old.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd's CRL stepped back from %v to %v", afterA, oldList.Number)

	delB, err := m.DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: b.ID, SafetyBypassNotDecommissioned: true})
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]string(nil), delA.RevokedSerials...), delB.RevokedSerials...)
	return within(10*time.Second, func() error {
		n, revoked, err := servedCRL(ctx, c)
		if err != nil {
			return err
		}
		if n.Cmp(afterA) <= 0 {
			return fmt.Errorf("the curator serves CRL %v, not newer than %v, held before B's deletion", n, afterA)
		}
		for _, s := range want {
			if !revoked[s] {
				return fmt.Errorf("CRL %v does not revoke %s (A's %v, B's %v)", n, s, delA.RevokedSerials, delB.RevokedSerials)
			}
		}
		for name, ag := range map[string]*cut.Agent{"A": a, "B": b} {
			if !refused(ctx, c, ag) {
				return fmt.Errorf("deleted node %s's certificate still works (CRL %v)", name, n)
			}
		}
		return nil
	})
}

// servedCRL is the number and the serials of the CRL the running curator
// serves (WatchCRL's first answer: the list it holds).
func servedCRL(ctx context.Context, c *cut.Cluster) (*big.Int, map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(c.Conn(c.Running(), cut.Admin)).WatchCRL(ctx, &curatorv1.WatchCRLRequest{})
	if err != nil {
		return nil, nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	l, err := pki.ParseCRL(resp.GetCrl())
	if err != nil {
		return nil, nil, err
	}
	revoked := map[string]bool{}
	for _, e := range l.RevokedCertificateEntries {
		revoked[e.SerialNumber.Text(16)] = true
	}
	return l.Number, revoked, nil
}

// refused reports whether the curator refuses a's certificate (a new
// connection: the handshake checks the CRL).
func refused(ctx context.Context, c *cut.Cluster, a *cut.Agent) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := a.Curator(c.Running()).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	return err != nil
}

// pollUntil is within that fails the test.
func pollUntil(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	if err := within(timeout, f); err != nil {
		t.Fatal(err)
	}
}

// within polls f until it returns nil, or returns its last error once
// timeout passed (proctest.Eventually, for a check that a mutation test
// expects to fail).
func within(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	wait := 10 * time.Millisecond
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 500*time.Millisecond)
	}
}
