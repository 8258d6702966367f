package etcdmaint

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"curia.dev/platform/keys"
)

// Member is one etcd member as an observation saw it.
type Member struct {
	ID       uint64
	Name     string
	Endpoint string // its first client URL
	Learner  bool
	// Answered: its status came back; the rest is that status.
	Answered     bool
	LeaderID     uint64 // the etcd leader it names
	DBSize       int64
	DBInUse      int64
	Quota        int64
	RaftIndex    uint64 // committed
	AppliedIndex uint64
}

func (m Member) wasted() int64 { return m.DBSize - m.DBInUse }

func (m Member) fragmentation() float64 {
	if m.DBSize <= 0 {
		return 0
	}
	return float64(m.wasted()) / float64(m.DBSize)
}

// Observation is every member's status, the pending membership change
// record and the alarms, read at about the same time: what defragmentation
// and maintenance decide from.
type Observation struct {
	Members []Member
	// Pending: a membership change record exists.
	Pending bool
	Alarms  []*etcdserverpb.AlarmMember
}

// Leader is the etcd leader the members agree on (0: none, or they
// disagree), and why not when there is none.
func (o Observation) Leader() (uint64, string) {
	var leader uint64
	for _, m := range o.Members {
		if !m.Answered {
			continue
		}
		if m.LeaderID == 0 {
			return 0, fmt.Sprintf("member %x knows no leader", m.ID)
		}
		if leader != 0 && m.LeaderID != leader {
			return 0, fmt.Sprintf("members name different leaders (%x, %x)", leader, m.LeaderID)
		}
		leader = m.LeaderID
	}
	if leader == 0 {
		return 0, "no member answered"
	}
	return leader, ""
}

// Unhealthy says why the cluster is not healthy enough to take a member
// out of service for a while ("" when it is): a voter does not answer,
// there is no leader, or a membership change is pending.
func (o Observation) Unhealthy() string {
	if o.Pending {
		return "a membership change is pending"
	}
	for _, m := range o.Members {
		if !m.Learner && !m.Answered {
			return fmt.Sprintf("voter %x (%s) does not answer", m.ID, m.Name)
		}
	}
	_, why := o.Leader()
	return why
}

// Observer reads etcd's members and moves its leadership.
type Observer struct {
	// Etcd is the cluster's client (any member answers).
	Etcd *clientv3.Client
	// Member makes calls to one member by its endpoint (Status, Dial,
	// Defragment): a client whose endpoints never change.
	Member *clientv3.Client
	Log    *slog.Logger
}

// Observe reads every member's status, the pending membership change
// record and the alarms.
func (ob Observer) Observe(ctx context.Context) (Observation, error) {
	lctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	list, err := ob.Etcd.MemberList(lctx)
	if err != nil {
		return Observation{}, fmt.Errorf("list etcd members: %w", err)
	}
	pending, err := ob.Etcd.Get(lctx, keys.MembershipPending, clientv3.WithCountOnly())
	if err != nil {
		return Observation{}, fmt.Errorf("read the pending membership change: %w", err)
	}
	alarms, err := ob.Etcd.AlarmList(lctx)
	if err != nil {
		return Observation{}, fmt.Errorf("list etcd alarms: %w", err)
	}
	o := Observation{Pending: pending.Count > 0, Alarms: alarms.Alarms, Members: make([]Member, len(list.Members))}
	var wg sync.WaitGroup
	for i, lm := range list.Members {
		o.Members[i] = Member{ID: lm.ID, Name: lm.Name, Learner: lm.IsLearner}
		if len(lm.ClientURLs) > 0 {
			o.Members[i].Endpoint = lm.ClientURLs[0]
			wg.Go(func() { ob.memberStatus(ctx, &o.Members[i]) })
		}
	}
	wg.Wait()
	return o, nil
}

// memberStatus fills in m's status, if it answers.
func (ob Observer) memberStatus(ctx context.Context, m *Member) {
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := ob.Member.Status(sctx, m.Endpoint)
	if err != nil {
		m.Answered = false
		return
	}
	m.Answered, m.LeaderID = true, st.Leader
	m.DBSize, m.DBInUse, m.Quota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
	m.RaftIndex, m.AppliedIndex = st.RaftIndex, st.RaftAppliedIndex
}

// MoveLeader moves etcd's leadership from leader to the caught-up voter
// (moveLeaderMaxLag) that applied the most, as o saw them, and waits until
// the members follow it. It returns the member leadership moved to.
func (ob Observer) MoveLeader(ctx context.Context, o Observation, leader uint64) (uint64, error) {
	var from Member
	for _, m := range o.Members {
		if m.ID == leader {
			from = m
		}
	}
	var to *Member
	for _, m := range o.Members {
		if m.ID == leader || m.Learner || !m.Answered || m.AppliedIndex+moveLeaderMaxLag < from.AppliedIndex {
			continue
		}
		if to == nil || m.AppliedIndex > to.AppliedIndex {
			to = &m
		}
	}
	if to == nil {
		return 0, fmt.Errorf("no caught-up voter to move etcd leadership to from %x", leader)
	}
	cc, err := ob.Member.Dial(from.Endpoint)
	if err != nil {
		return 0, fmt.Errorf("dial etcd leader %x: %w", leader, err)
	}
	defer cc.Close()
	mctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	if _, err := etcdserverpb.NewMaintenanceClient(cc).MoveLeader(mctx, &etcdserverpb.MoveLeaderRequest{TargetID: to.ID}); err != nil {
		return 0, fmt.Errorf("move etcd leadership from %x to %x: %w", leader, to.ID, err)
	}
	ob.Log.Info("etcd leadership moved", "from", fmt.Sprintf("%x", leader), "to", fmt.Sprintf("%x", to.ID))
	return to.ID, ob.until(mctx, func(o Observation) bool {
		l, _ := o.Leader()
		return l != 0 && l != leader && o.Unhealthy() == ""
	})
}

// until observes etcd until cond holds or ctx ends.
func (ob Observer) until(ctx context.Context, cond func(Observation) bool) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		o, err := ob.Observe(ctx)
		if err == nil && cond(o) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("not within %v: %w (last: %w)", catchUpTimeout, ctx.Err(), err)
			}
			return fmt.Errorf("not within %v: %w", catchUpTimeout, ctx.Err())
		case <-t.C:
		}
	}
}
