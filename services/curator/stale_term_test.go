package curator_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// TestStaleTermWriteRefused freezes the leader (SIGSTOP) past its session
// TTL so that another replica leads, then wakes it and writes through it at
// once. The old leader must not write with its old term: the call is either
// refused (Unavailable) or lands under the new term, never the old one.
func TestStaleTermWriteRefused(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	old := c.Leader()
	oldTerm := term(t, c, old)

	// A NEW node to approve through the old leader later.
	a := c.NewAgent()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Enrolling(old).RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket.Ticket, PublicKey: publicKey(a)}); err != nil {
		t.Fatal(err)
	}

	old.Pause()
	var next *cut.Curator
	proctest.Eventually(t, time.Minute, func() error {
		for _, cur := range c.Curators {
			if cur != old && term(t, c, cur) > oldTerm {
				next = cur
				return nil
			}
		}
		return errors.New("no new term yet")
	})
	old.Resume()

	_, err = curatorv1.NewManagementClient(c.Conn(old, cut.Admin)).ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID})
	switch status.Code(err) {
	case codes.OK:
	case codes.Unavailable:
		t.Logf("old leader refused: %v", err)
	default:
		t.Fatalf("approve through the old leader: %v", err)
	}
	// Every approval in the audit log was made under the new term.
	for _, ev := range cut.AuditLog(t, curatorv1.NewManagementClient(c.Conn(next, cut.Admin))) {
		if ev.Action != auditv1.AuditAction_AUDIT_ACTION_NODE_APPROVE {
			continue
		}
		for _, f := range ev.Fence {
			if strings.HasSuffix(f, "@"+strconv.FormatInt(oldTerm, 10)) {
				t.Fatalf("approval recorded under the old term %d: %v", oldTerm, ev)
			}
		}
	}
}

// term asks a replica who leads and returns the term it reports (0 if it
// does not answer).
func term(t *testing.T, c *cut.Cluster, cur *cut.Curator) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(c.Conn(cur, cut.Admin)).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		return 0
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0
	}
	return resp.Term
}

func publicKey(a *cut.Agent) []byte { return a.Key.Public().(ed25519.PublicKey) }
