package dashboard

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/nodes"
	"curia.dev/platform/run"
)

// view is what the dashboard knows of the cluster, kept by four parts:
//
//	nodes    Curator/Watch(all_nodes): the node registry
//	audit    Management/WatchAuditLog: the newest events, and the newest
//	         membership events (the timeline) out of a larger backlog
//	leader   Curator/GetCurrentLeader: the curator leader and term
//	status   asked on every change the streams report, and every Refresh:
//	         GetClusterInfo, GetConsensusStatus, GetClusterConfig, ListNodes
//	         BASIC (heartbeats: a heartbeat that changes no health is no
//	         Watch event; no certificates, which the pages never show),
//	         and each reconciler's GetStatus and the active one's Plan;
//	         each consensus status is sampled into the history ring
//	         (history.go)
//
// Every change bumps the version and wakes the event streams (changed).
type view struct {
	cfg     Config
	log     *slog.Logger
	cur     curatorv1.CuratorClient
	mgmt    curatorv1.ManagementClient
	recAddr []string
	recs    []reconcilerv1.ReconcilerClient
	poke    chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	s       state
	hist    *history // under mu; state.History is its copy
}

// state is one consistent copy of the view, for rendering.
type state struct {
	Nodes       map[string]*curatorv1.Node
	NodesSynced bool
	NodesErr    error
	Heartbeats  map[string]*curatorv1.Node // ListNodes BASIC: fresh health and heartbeat
	Audit       []auditEntry               // newest first
	Timeline    []auditEntry               // the membership events (inTimeline), newest first
	AuditErr    error
	Leader      *curatorv1.GetCurrentLeaderResponse
	LeaderErr   error
	Info        *curatorv1.GetClusterInfoResponse
	Consensus   *curatorv1.GetConsensusStatusResponse
	Config      *curatorv1.GetClusterConfigResponse
	StatusErr   error
	Reconcilers []reconcilerState
	Plan        *reconcilerv1.PlanResponse
	PlanFrom    string
	PlanErr     error
	Updated     time.Time // when status was last asked
	History     []sample  // the consensus status over time, oldest first
	// LearnerSeen is when the dashboard first saw each learner (by member
	// id) a learner, for a learner whose add is older than the audit
	// backlog.
	LearnerSeen map[uint64]time.Time
}

type auditEntry struct {
	Event    *auditv1.Event
	Revision int64
}

type reconcilerState struct {
	Addr   string
	Status *reconcilerv1.GetStatusResponse
	Err    error
}

func newView(cfg Config, log *slog.Logger, cur curatorv1.CuratorClient, mgmt curatorv1.ManagementClient, recAddr []string, recs []reconcilerv1.ReconcilerClient) *view {
	return &view{
		cfg: cfg, log: log, cur: cur, mgmt: mgmt, recAddr: recAddr, recs: recs,
		poke:    make(chan struct{}, 1),
		changed: make(chan struct{}),
		s:       state{Nodes: map[string]*curatorv1.Node{}},
		hist:    newHistory(cfg.Refresh, cfg.History),
	}
}

func (v *view) addParts(g *run.Group) {
	g.AddReady("nodes", v.watchNodes)
	g.AddReady("audit", v.watchAudit)
	g.AddReady("leader", v.watchLeader)
	g.AddReady("status", v.pollStatus)
}

// update changes the state under the lock, wakes the event streams and,
// with ask, the status part.
func (v *view) update(ask bool, f func(s *state)) {
	v.mu.Lock()
	f(&v.s)
	close(v.changed)
	v.changed = make(chan struct{})
	v.mu.Unlock()
	if ask {
		select {
		case v.poke <- struct{}{}:
		default:
		}
	}
}

// snapshot is the state now (the maps and messages are shared: never
// changed in place, only replaced) and a channel closed at its next change.
func (v *view) snapshot() (state, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.s, v.changed
}

// follow runs one stream again and again until ctx ends, waiting a backoff
// between attempts that ended in an error.
func follow(ctx context.Context, log *slog.Logger, what string, once func(ctx context.Context) error) error {
	b := backoff.New(200*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		err := once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		log.Debug("stream ended", "stream", what, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(b.Next()):
		}
	}
	return nil
}

func (v *view) watchNodes(ctx context.Context) error {
	var rev int64
	return follow(ctx, v.log, "nodes", func(ctx context.Context) error {
		stream, err := v.cur.Watch(ctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}, StartRevision: rev})
		if err != nil {
			v.update(false, func(s *state) { s.NodesErr = err })
			return err
		}
		var building map[string]*curatorv1.Node // a snapshot in several messages
		for {
			resp, err := stream.Recv()
			if err != nil {
				if status.Code(err) == codes.OutOfRange {
					rev = 0 // too old to resume: start with a snapshot
				}
				v.update(false, func(s *state) { s.NodesErr = err })
				return err
			}
			if resp.Snapshot {
				building = map[string]*curatorv1.Node{}
			}
			if building != nil {
				for _, n := range resp.Nodes {
					building[n.Id] = n
				}
				if resp.Revision != 0 {
					nodes := building
					building = nil
					v.update(true, func(s *state) { s.Nodes, s.NodesSynced, s.NodesErr = nodes, true, nil })
				}
			} else if len(resp.Nodes) > 0 || len(resp.Deleted) > 0 {
				v.update(true, func(s *state) {
					nodes := make(map[string]*curatorv1.Node, len(s.Nodes)+len(resp.Nodes))
					for id, n := range s.Nodes {
						nodes[id] = n
					}
					for _, n := range resp.Nodes {
						nodes[n.Id] = n
					}
					for _, id := range resp.Deleted {
						delete(nodes, id)
					}
					s.Nodes, s.NodesErr = nodes, nil
				})
			}
			if resp.Revision != 0 {
				rev = resp.Revision
			}
		}
	})
}

func (v *view) watchAudit(ctx context.Context) error {
	var rev int64
	return follow(ctx, v.log, "audit", func(ctx context.Context) error {
		req := &curatorv1.WatchAuditLogRequest{Backlog: auditBacklog}
		if rev != 0 {
			req = &curatorv1.WatchAuditLogRequest{StartRevision: rev}
		}
		stream, err := v.mgmt.WatchAuditLog(ctx, req)
		if err != nil {
			v.update(false, func(s *state) { s.AuditErr = err })
			return err
		}
		first := rev == 0
		for {
			resp, err := stream.Recv()
			if err != nil {
				if status.Code(err) == codes.OutOfRange {
					rev = 0
				}
				v.update(false, func(s *state) { s.AuditErr = err })
				return err
			}
			rev = resp.Revision
			v.update(true, func(s *state) {
				entries, timeline := s.Audit, s.Timeline
				if first {
					entries, timeline, first = nil, nil, false // a backlog replaces what was known
				}
				e := auditEntry{Event: resp.Event, Revision: resp.Revision}
				s.Audit, s.AuditErr = prepend(e, entries, v.cfg.AuditEvents), nil
				if inTimeline(e.Event) {
					s.Timeline = prepend(e, timeline, v.cfg.TimelineEvents)
				} else {
					s.Timeline = timeline
				}
			})
		}
	})
}

// auditBacklog is how many past events the audit stream asks for: the
// most the curator sends, so that the timeline reaches back to the
// cluster's formation when the audit page's newest AuditEvents do not.
const auditBacklog = 10000

// prepend is e and then the newest of newestFirst, limit in all: a new
// slice (a state's slices are shared, never changed in place).
func prepend(e auditEntry, newestFirst []auditEntry, limit int) []auditEntry {
	out := make([]auditEntry, 0, min(len(newestFirst)+1, limit))
	out = append(out, e)
	return append(out, newestFirst[:min(len(newestFirst), limit-1)]...)
}

func (v *view) watchLeader(ctx context.Context) error {
	return follow(ctx, v.log, "leader", func(ctx context.Context) error {
		stream, err := v.cur.GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
		if err != nil {
			v.update(false, func(s *state) { s.LeaderErr = err })
			return err
		}
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				err = errors.New("the curator ended the leader stream")
			}
			if err != nil {
				v.update(false, func(s *state) { s.LeaderErr = err })
				return err
			}
			v.update(true, func(s *state) { s.Leader, s.LeaderErr = resp, nil })
		}
	})
}

// pollStatus asks for what no stream carries: at once when a stream
// reported a change (after a short pause that gathers a burst), and every
// Refresh.
func (v *view) pollStatus(ctx context.Context) error {
	tick := time.NewTicker(v.cfg.Refresh)
	defer tick.Stop()
	for {
		v.askStatus(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-v.poke:
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

func (v *view) askStatus(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var (
		wg       sync.WaitGroup
		info     *curatorv1.GetClusterInfoResponse
		cons     *curatorv1.GetConsensusStatusResponse
		config   *curatorv1.GetClusterConfigResponse
		beats    map[string]*curatorv1.Node
		errs     [4]error
		recs     = make([]reconcilerState, len(v.recs))
		plan     *reconcilerv1.PlanResponse
		planFrom string
		planErr  error
	)
	wg.Go(func() { info, errs[0] = v.mgmt.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{}) })
	wg.Go(func() { cons, errs[1] = v.mgmt.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{}) })
	wg.Go(func() { config, errs[2] = v.mgmt.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{}) })
	wg.Go(func() { beats, errs[3] = v.heartbeats(ctx) })
	wg.Go(func() {
		var rw sync.WaitGroup
		for i, r := range v.recs {
			rw.Go(func() {
				st, err := r.GetStatus(ctx, &reconcilerv1.GetStatusRequest{})
				recs[i] = reconcilerState{Addr: v.recAddr[i], Status: st, Err: err}
			})
		}
		rw.Wait()
		// The plan of the active replica, else of any that answers.
		order := slices.Clone(recs)
		slices.SortStableFunc(order, func(a, b reconcilerState) int {
			return activeRank(a) - activeRank(b)
		})
		planErr = errors.New("no reconciler address given (--reconciler)")
		for _, r := range order {
			i := slices.Index(v.recAddr, r.Addr)
			plan, planErr = v.recs[i].Plan(ctx, &reconcilerv1.PlanRequest{})
			if planErr == nil {
				planFrom = r.Addr
				break
			}
		}
	})
	wg.Wait()
	v.update(false, func(s *state) {
		s.Info, s.Consensus, s.Config, s.Heartbeats = keep(info, s.Info), keep(cons, s.Consensus), keep(config, s.Config), keepMap(beats, s.Heartbeats)
		s.StatusErr = errors.Join(errs[:]...)
		s.Reconcilers = recs
		s.Plan, s.PlanFrom, s.PlanErr = plan, planFrom, planErr
		s.Updated = time.Now()
		if cons != nil {
			if v.hist.add(sampleOf(s.Updated, cons)) {
				s.History = v.hist.samples.slice()
			}
			s.LearnerSeen = learnersSeen(s.LearnerSeen, cons, s.Updated)
		}
	})
}

// learnersSeen is when each learner of cons was first seen one: last's
// times for those it knew, now for new ones; a learner no longer one is
// forgotten. Always a new map: a state's maps are shared.
func learnersSeen(last map[uint64]time.Time, cons *curatorv1.GetConsensusStatusResponse, now time.Time) map[uint64]time.Time {
	next := map[uint64]time.Time{}
	for _, m := range cons.GetMembers() {
		if m.GetLearner() {
			if t, ok := last[m.GetMemberId()]; ok {
				next[m.GetMemberId()] = t
			} else {
				next[m.GetMemberId()] = now
			}
		}
	}
	return next
}

// activeRank orders reconcilers: the active one first, then those that
// answered.
func activeRank(r reconcilerState) int {
	switch {
	case r.Err != nil:
		return 2
	case r.Status.GetRole() == reconcilerv1.Role_ROLE_ACTIVE:
		return 0
	}
	return 1
}

// keep is the new answer, or the last one when the call failed (the error
// is shown beside it).
func keep[T any](now, last *T) *T {
	if now != nil {
		return now
	}
	return last
}

func keepMap(now, last map[string]*curatorv1.Node) map[string]*curatorv1.Node {
	if now != nil {
		return now
	}
	return last
}

// heartbeats lists the nodes for their health and last heartbeat.
func (v *view) heartbeats(ctx context.Context) (map[string]*curatorv1.Node, error) {
	list, err := nodes.ListBasic(ctx, v.mgmt, "")
	if err != nil {
		return nil, err
	}
	out := make(map[string]*curatorv1.Node, len(list))
	for _, n := range list {
		out[n.GetId()] = n
	}
	return out, nil
}
