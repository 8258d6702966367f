package curator_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// TestSupersededClusterRefused (issue 29, N4): two of three voters freeze,
// the cluster is recovered from the third, and the two thaw while a
// client registers nodes, one after another; the curator is then
// restarted with the three members' addresses, as its --etcd names them.
// The thawed pair holds the old cluster's quorum and would acknowledge
// writes the recovered cluster never sees; every registration the curator
// acknowledged is in the recovered cluster, and the curator started last
// goes on registering.
//
// Without the pin (CURIA_MUTATIONS=no-cluster-pin) this scenario fails only
// sometimes (the curator stalled between the two clusters in one run of
// three): the endpoint probe alone mostly settles on the recovered
// cluster's member list. TestEndpointsFollowARecovery and etcdpin's
// TestPinRefusesAnotherCluster fail every time.
func TestSupersededClusterRefused(t *testing.T) {
	if err := writesAcrossARecovery(t); err != nil {
		t.Fatal(err)
	}
}

// registrar registers new nodes one after another, remembering those the
// curator acknowledged.
type registrar struct {
	c      *cut.Cluster
	ticket []byte
	addr   atomic.Pointer[string] // the curator asked
	mu     sync.Mutex
	acked  []string
	failed int
}

// run registers until ctx ends.
func (r *registrar) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.register(ctx)
		if err != nil {
			r.mu.Lock()
			r.failed++
			r.mu.Unlock()
			select { // a failing curator is not asked in a tight loop
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// register registers one new node, on a connection of its own.
func (r *registrar) register(ctx context.Context) error {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	cc, err := rpc.DialEnrolling(*r.addr.Load(), r.c.PKI.CA.CertPEM, key, []pki.Kind{pki.KindCurator})
	if err != nil {
		return err
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = curatorv1.NewCuratorClient(cc).RegisterNode(cctx, &curatorv1.RegisterNodeRequest{RegisterTicket: r.ticket, PublicKey: pub})
	if err == nil {
		r.mu.Lock()
		r.acked = append(r.acked, pki.NodeID(pub))
		r.mu.Unlock()
	}
	return err
}

func (r *registrar) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// more waits until n more registrations are acknowledged.
func (r *registrar) more(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	if err := r.awaitMore(n, timeout); err != nil {
		t.Fatal(err)
	}
}

// awaitMore waits until n more registrations are acknowledged, or says how
// many were within timeout.
func (r *registrar) awaitMore(n int, timeout time.Duration) error {
	from := r.count()
	deadline := time.Now().Add(timeout)
	for wait := 10 * time.Millisecond; r.count() < from+n; wait = min(2*wait, time.Second) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d registrations acknowledged within %v, want %d", r.count()-from, timeout, n)
		}
		time.Sleep(wait)
	}
	return nil
}

// writesAcrossARecovery runs the scenario of TestSupersededClusterRefused
// and returns what is wrong with the acknowledged writes; it fails the
// test for everything else.
func writesAcrossARecovery(t *testing.T) error {
	t.Helper()
	proctest.SkipShort(t)
	c := cut.NewWithOptions(t, cut.Options{Voters: 3, Curators: 1})
	survivor, lost := c.Voters[0], c.Voters[1:]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r := &registrar{c: c, ticket: ticket.Ticket}
	r.addr.Store(&c.Curators[0].Addr)
	wctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.run(wctx) })
	stopped := false
	defer func() {
		if !stopped {
			stop()
			wg.Wait()
		}
	}()
	r.more(t, 5, 30*time.Second)

	before := survivor.Status()
	for _, n := range lost {
		n.Pause()
	}
	thawed := false
	defer func() {
		if !thawed {
			for _, n := range lost {
				n.Resume()
			}
		}
	}()
	proctest.Eventually(t, 30*time.Second, func() error {
		if st := survivor.Status(); st.LeaderId != 0 {
			return fmt.Errorf("%s still follows leader %s", survivor.ID, types.ID(st.LeaderId))
		}
		return nil
	})
	admin := pki.Principal{Kind: pki.KindAdmin, Name: "ops"}
	if _, err := survivor.Consensus(admin).Recover(ctx, &consensusv1.RecoverRequest{MemberId: before.MemberId, Reason: "test: two voters frozen"}); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	after := survivor.Status()
	t.Logf("recovered: cluster %s superseded %s", types.ID(after.GetClusterId()), types.ID(before.GetClusterId()))
	r.more(t, 5, time.Minute) // the curator writes into the recovered cluster

	for _, n := range lost {
		n.Resume()
	}
	thawed = true
	// The thawed pair holds the old cluster's quorum again.
	proctest.Eventually(t, time.Minute, func() error {
		for _, n := range lost {
			if st := n.Status(); st.LeaderId == 0 || st.GetClusterId() != before.GetClusterId() {
				return fmt.Errorf("%s: cluster %s, leader %s: not the old cluster's quorum yet", n.ID, types.ID(st.GetClusterId()), types.ID(st.LeaderId))
			}
		}
		return nil
	})
	r.more(t, 10, time.Minute)

	// A curator that starts now is given the three members, the old
	// cluster's first: the one it asks first answers for the old cluster.
	c.Curators[0].Kill()
	c.Voters = []*ct.Node{lost[0], lost[1], survivor}
	r.addr.Store(&c.AddCurator().Addr)
	// Without a pin, the curator may stall between the two clusters
	// rather than write into the old one; that is a failure too.
	progress := r.awaitMore(30, time.Minute)
	stop()
	wg.Wait()
	stopped = true

	cli := c.Etcd(survivor.ClientURL)
	var missing []string
	for _, id := range r.acked {
		resp, err := cli.Get(ctx, keys.Node(id))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			missing = append(missing, id)
		}
	}
	t.Logf("%d registrations acknowledged (%d refused or failed), %d missing from the recovered cluster", len(r.acked), r.failed, len(missing))
	if progress != nil {
		return fmt.Errorf("the curator started after the thaw: %w", progress)
	}
	if len(missing) > 0 {
		return errors.New(fmt.Sprint(len(missing), " of ", len(r.acked), " acknowledged registrations are not in the recovered cluster, e.g. ", missing[0]))
	}
	return nil
}
