package consensus_test

import (
	"context"
	"testing"
	"time"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	ct "curia.dev/services/consensus/consensustest"
)

// BenchmarkBootstrapToReady measures Start(bootstrap) on an idle node until
// its new single-member cluster serves (the call returns when it does).
func BenchmarkBootstrapToReady(b *testing.B) {
	c := ct.NewCluster(b)
	for b.Loop() {
		b.StopTimer()
		n := c.NewNode()
		b.StartTimer()
		c.Bootstrap(n)
		b.StopTimer()
		n.Kill()
		b.StartTimer()
	}
}

// BenchmarkJoinToVoter measures a node's way from AddNode through Start(join)
// to a successful promotion, against a one-voter cluster. Between rounds the
// node is removed and wiped, outside the timer.
func BenchmarkJoinToVoter(b *testing.B) {
	c := ct.NewCluster(b)
	ctx := context.Background()
	n1 := c.NewNode()
	c.Bootstrap(n1)
	leader := c.Campaign(c.Etcd(n1.ClientURL))
	n := c.NewNode()
	for b.Loop() {
		id := c.Join(n1, n, leader.Fence)
		c.Promote(n1, id, leader.Fence)
		b.StopTimer()
		err := ct.RetryUnavailable(b, func() error {
			_, err := n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: id}, Fence: n1.Fenced(leader.Fence)})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		ct.Eventually(b, 30*time.Second, func() error {
			_, err := n.Self().Leave(ctx, &consensusv1.LeaveRequest{})
			return err
		})
		b.StartTimer()
	}
}
