package roleserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/run"
	"curia.dev/services/roleserve/internal/reduce"
)

// The control loop reduces the inputs (bootstrap data, roles, local
// configuration) into a decision whenever one of them changes, and hands a
// flip of "this node runs consensus" — or a role naming another member — to
// the launcher:
//
//	roles update ─▶ kick ─▶ reduce.Reduce ─▶ reduce.Next(in force, new) ─┬─ no flip, same member: keep going
//	                                                                      └─ flip or another member: cancel
//	                                                                         the running action, start the
//	                                                                         new one
//
// Launcher actions on the local consensus:
//
//	run, join       Status first: a local consensus that holds the data of
//	                another member than the one the role names (the node
//	                was removed and added again while the agent did not
//	                see the role absent) is told to Leave, which consensus
//	                refuses while that member is still in etcd
//	                (FailedPrecondition: retried, never wiped on a guess);
//	                then Start(join parameters in force) until it succeeds.
//	                A member that runs with the role's member id is left
//	                alone. Unavailable and the refused Leave are retried
//	                with backoff, other refusals slowly (they wait for an
//	                operator or a new role)
//	run, bootstrap  the member this node bootstrapped (enrolment started it)
//	                is checked to run; an empty local consensus is never
//	                bootstrapped again
//	no consensus    Leave until it succeeds: consensus refuses while the
//	                node is still an etcd member (FailedPrecondition, the
//	                normal answer until the curator removed the member), so
//	                data of a member is never wiped

// Launcher phases, as GetStatus shows them.
const (
	phaseNone     = "none"
	phaseStarting = "starting"
	phaseRunning  = "running"
	phaseLeaving  = "leaving"
	phaseLeft     = "left"
)

// reduceInput gathers the reduce's inputs.
func (s *Service) reduceInput() reduce.Input {
	rec, _ := s.machine.record()
	s.mu.Lock()
	defer s.mu.Unlock()
	return reduce.Input{
		Bootstrapped:   rec.Bootstrapped,
		RolesConfirmed: s.st.rolesKnown,
		Roles:          s.st.node.GetRoles(),
		ClusterCAs:     s.caCerts,
		LocalConsensus: s.cfg.Consensus != "",
	}
}

// decisionInForce is the decision the launcher carries out.
func (s *Service) decisionInForce() reduce.Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.decision
}

// control runs the reduce on every change of its inputs and the launcher
// on every flip.
func (s *Service) control(ctx context.Context) error {
	if !waitFor(ctx, s.enrolled) {
		return nil
	}
	log := s.log.With("part", "control")
	var (
		inForce reduce.Decision
		ignored string
		running *action
	)
	defer func() { running.stop() }()
	for {
		in := s.reduceInput()
		d := reduce.Reduce(in)
		next, act := reduce.Next(inForce, d)
		if !d.Decided && d.Reason != ignored {
			if inForce.Decided || in.Roles.GetConsensusMember() != nil {
				log.Warn("input decides nothing: the decision in force stays", "reason", d.Reason, "in_force", inForce.Reason)
			} else {
				log.Info("nothing decided yet", "reason", d.Reason)
			}
		}
		if d.Decided {
			ignored = ""
		} else {
			ignored = d.Reason
		}
		s.mu.Lock()
		s.st.decision, s.st.ignored = next, ignored
		if act {
			s.st.since = time.Now()
		}
		s.mu.Unlock()
		if act {
			log.Info("control plane decision", "run_consensus", next.Run, "mode", next.Mode.String(), "member", memberHex(next), "reason", next.Reason, "was", inForce.Run, "was_member", memberHex(inForce))
			running.stop()
			running = s.startAction(ctx, next)
		} else if next.Decided && next.Reason != inForce.Reason {
			log.Info("control plane decision unchanged", "run_consensus", next.Run, "mode", next.Mode.String(), "reason", next.Reason)
		}
		inForce = next
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		}
	}
}

// action is one launcher action running in the background.
type action struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startAction runs launch(d) in the background until it finished or is
// stopped.
func (s *Service) startAction(ctx context.Context, d reduce.Decision) *action {
	actx, cancel := context.WithCancel(ctx)
	a := &action{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		s.launch(actx, d)
	}()
	return a
}

// stop cancels the action and waits for it to return (nil: nothing runs).
func (a *action) stop() {
	if a == nil {
		return
	}
	a.cancel()
	<-a.done
}

// setLauncher records the launcher's progress for GetStatus.
func (s *Service) setLauncher(phase string, attempts int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.launcher = launcherState{phase: phase, attempts: attempts}
	if err != nil {
		s.st.launcher.lastError = err.Error()
	}
}

// launch carries out one decision until it succeeded or ctx ends (a new
// flip cancels it).
func (s *Service) launch(ctx context.Context, d reduce.Decision) {
	log := s.log.With("part", "launcher")
	if s.cfg.Consensus == "" {
		s.setLauncher(phaseNone, 0, nil)
		return
	}
	var act func(context.Context) (bool, error)
	phase := phaseStarting
	switch {
	case d.Run && d.Mode == reduce.ModeBootstrap:
		act = s.confirmBootstrapped
	case d.Run:
		act = s.startJoin
	default:
		phase, act = phaseLeaving, s.leave
	}
	bo := backoff.New(retryMin, s.cfg.RetryMax)
	lastCode := codes.OK
	for attempt := int64(1); ; attempt++ {
		s.setLauncher(phase, attempt, nil)
		again, err := act(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil && !again {
			if phase == phaseLeaving {
				phase = phaseLeft
			} else {
				phase = phaseRunning
			}
			s.setLauncher(phase, attempt, nil)
			log.Info("local consensus follows the decision", "phase", phase, "attempts", attempt)
			signal(s.statusKick)
			return
		}
		wait := bo.After(err)
		if err != nil {
			code := status.Code(err)
			if code != lastCode {
				// One line per kind of answer, not one per attempt.
				log.Info("local consensus refused or did not answer; retrying", "phase", phase, "code", code.String(), "err", err)
				lastCode = code
			}
			// A refused Leave is the normal answer until the curator
			// removed the member: retried with backoff like Unavailable.
			leaveRefused := code == codes.FailedPrecondition && (phase == phaseLeaving || errors.Is(err, errLeaveFirst))
			if !transient(err) && !leaveRefused {
				wait = bo.Slowest()
			}
			s.setLauncher(phase, attempt, err)
		}
		if !run.Sleep(ctx, wait) {
			return
		}
	}
}

// localConsensus is the part of the local consensus service's API the
// agent uses (consensusv1.ConsensusClient; tests fake it).
type localConsensus interface {
	Status(context.Context, *consensusv1.StatusRequest, ...grpc.CallOption) (*consensusv1.StatusResponse, error)
	Start(context.Context, *consensusv1.StartRequest, ...grpc.CallOption) (*consensusv1.StartResponse, error)
	Leave(context.Context, *consensusv1.LeaveRequest, ...grpc.CallOption) (*consensusv1.LeaveResponse, error)
	SetCredentials(context.Context, *consensusv1.SetCredentialsRequest, ...grpc.CallOption) (*consensusv1.SetCredentialsResponse, error)
}

// localConsensus is the local consensus service's API with the node
// certificate.
func (s *Service) localConsensus() (localConsensus, error) {
	_, cons, err := s.conns()
	if err != nil {
		return nil, err
	}
	if cons == nil {
		return nil, fmt.Errorf("no local consensus is configured (--consensus)")
	}
	return consensusv1.NewConsensusClient(cons), nil
}

// localConsensusStatus asks the local consensus for its status and checks
// that it is this node's.
func (s *Service) localConsensusStatus(ctx context.Context) (*consensusv1.StatusResponse, error) {
	cons, err := s.localConsensus()
	if err != nil {
		return nil, err
	}
	return consensusStatus(ctx, cons, s.id, s.cfg.Consensus)
}

// consensusStatus asks cons (the consensus service at addr) for its status
// and checks that it is node nodeID's.
func consensusStatus(ctx context.Context, cons localConsensus, nodeID, addr string) (*consensusv1.StatusResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, err := cons.Status(cctx, &consensusv1.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("local consensus status: %w", err)
	}
	if st.GetNodeId() != nodeID {
		return nil, status.Errorf(codes.FailedPrecondition, "the consensus service at %s is node %s's, not this node's (%s): fix --consensus", addr, st.GetNodeId(), nodeID)
	}
	return st, nil
}

// startJoin starts the local member with the join parameters in force
// (read at every attempt: a role re-sent with new parameters while a start
// retries is used without a flip). A member that runs is left alone.
func (s *Service) startJoin(ctx context.Context) (bool, error) {
	st, err := s.localConsensusStatus(ctx)
	if err != nil {
		return true, err
	}
	d := s.decisionInForce()
	if !d.Run || d.Join == nil {
		return true, status.Error(codes.FailedPrecondition, "no join parameters in force")
	}
	// The member certificate that came with the role, before the member
	// starts.
	if err := s.installRoleMember(ctx, st); err != nil {
		return true, err
	}
	cons, err := s.localConsensus()
	if err != nil {
		return true, err
	}
	if err := joinAs(ctx, cons, st, d.Join, s.log.With("part", "launcher")); err != nil {
		return true, err
	}
	return false, nil
}

// errLeaveFirst marks a Leave that a join needs first and that consensus
// refused or could not do yet.
var errLeaveFirst = errors.New("leave before joining")

// joinAs has the local consensus (whose status is st) run the member that
// join names. A local consensus that still holds the data of another
// member — removed from etcd while the agent did not see the role absent,
// then the node was added again — cannot start: it must Leave first, and
// consensus refuses that while the old member is still in etcd (the error
// wraps errLeaveFirst and the refusal). Nothing is wiped here on a guess:
// only consensus decides, from the live member list.
func joinAs(ctx context.Context, cons localConsensus, st *consensusv1.StatusResponse, join *consensusv1.JoinParameters, log *slog.Logger) error {
	want := join.GetMemberId()
	old := st.GetMemberId()
	switch st.GetState() {
	case consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING:
		if old != 0 && old != want {
			// Restarting the old member from its data; it stops once it
			// learns it was removed, and is left then.
			return status.Errorf(codes.Unavailable, "the local consensus is starting member %x, the role names member %x: waiting for it to run or stop", old, want)
		}
	case consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING,
		consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED,
		consensusv1.LifecycleState_LIFECYCLE_STATE_FAILED:
		if old != 0 && old != want {
			if err := leaveOther(ctx, cons, st, want, log); err != nil {
				return err
			}
		}
	}
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	resp, err := cons.Start(sctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}})
	if err != nil {
		return fmt.Errorf("start the local consensus (join as member %x): %w", want, err)
	}
	if got := resp.GetStatus().GetMemberId(); got != 0 && got != want {
		// Another member started meanwhile (Start leaves a running one
		// alone): the next attempt has it leave.
		return status.Errorf(codes.Aborted, "the local consensus runs member %x, the role names member %x", got, want)
	}
	log.Info("local consensus started", "member", fmt.Sprintf("%x", want), "already_started", resp.GetAlreadyStarted(), "state", resp.GetStatus().GetState().String())
	return nil
}

// leaveOther has the local consensus stop and wipe the member it holds
// (st) so that member want can start.
func leaveOther(ctx context.Context, cons localConsensus, st *consensusv1.StatusResponse, want uint64, log *slog.Logger) error {
	old := fmt.Sprintf("%x", st.GetMemberId())
	log.Info("local consensus holds the data of another member than the role names: leaving first",
		"old_member", old, "member", fmt.Sprintf("%x", want), "state", st.GetState().String(), "state_reason", st.GetStateReason())
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := cons.Leave(cctx, &consensusv1.LeaveRequest{}); err != nil {
		return fmt.Errorf("%w: the local consensus holds the data of member %s, the role names member %x: %w", errLeaveFirst, old, want, err)
	}
	log.Info("local consensus wiped the data of another member; joining as the member the role names", "old_member", old, "member", fmt.Sprintf("%x", want))
	return nil
}

// memberHex is the member a join decision names, for logs ("" if none).
func memberHex(d reduce.Decision) string {
	if d.Join == nil {
		return ""
	}
	return fmt.Sprintf("%x", d.Join.GetMemberId())
}

// confirmBootstrapped checks on the member this node bootstrapped the
// cluster with: the enrolment started it, and after a restart the
// consensus service restarts it from its data. It is never started again
// here: Start(bootstrap) on an empty local consensus would create a second
// cluster.
func (s *Service) confirmBootstrapped(ctx context.Context) (bool, error) {
	st, err := s.localConsensusStatus(ctx)
	if err != nil {
		return true, err
	}
	switch st.GetState() {
	case consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING:
		return false, nil
	case consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING:
		return true, nil
	case consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE:
		return true, status.Error(codes.FailedPrecondition, "this node bootstrapped the cluster but its local consensus has no data: refusing to bootstrap a second cluster")
	}
	return true, status.Errorf(codes.FailedPrecondition, "the member this node bootstrapped is %s: %s", st.GetState(), st.GetStateReason())
}

// leave stops the local member and wipes its data once this node is no
// longer an etcd member; the consensus service itself refuses before that.
func (s *Service) leave(ctx context.Context) (bool, error) {
	if _, err := s.localConsensusStatus(ctx); err != nil {
		return true, err
	}
	cons, err := s.localConsensus()
	if err != nil {
		return true, err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := cons.Leave(cctx, &consensusv1.LeaveRequest{})
	if err != nil {
		return true, fmt.Errorf("leave (stop and wipe the local member): %w", err)
	}
	if !resp.GetAlreadyIdle() {
		s.log.Info("local consensus left the cluster and wiped its data")
	}
	return false, nil
}
