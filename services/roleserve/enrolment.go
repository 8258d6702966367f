package roleserve

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
)

const (
	// callTimeout bounds one call to the curator or the local consensus.
	callTimeout = 30 * time.Second
	// startTimeout bounds a consensus Start (etcd starting, a join
	// catching up with the member list).
	startTimeout = 2 * time.Minute
	// retryMin is the first wait before an attempt is repeated.
	retryMin = 200 * time.Millisecond
	// ticketPoll is how often an agent looks for its register ticket file.
	ticketPoll = 250 * time.Millisecond
)

// enrolSteps is the work of each state of the machine; enroller does it
// against the curator and the local consensus. Every step is idempotent,
// so a step cut short by a crash simply runs again after the restart —
// except that the local consensus is bootstrapped at most once in the
// node's life (bootstrapLocal), so a bootstrap step run again after the
// consensus data was lost fails the machine.
type enrolSteps interface {
	// choose decides NEW's successor and returns the work of getting there.
	choose() (State, func(context.Context) error, error)
	// bootstrap: BOOTSTRAPPING → RUNNING.
	bootstrap(context.Context) error
	// register: REGISTERING → WAITING_FOR_APPROVAL.
	register(context.Context) error
	// awaitApproval: WAITING_FOR_APPROVAL → COMMITTING.
	awaitApproval(context.Context) error
	// commit: COMMITTING → RUNNING.
	commit(context.Context) error
}

// drive runs the machine until RUNNING (nil) or FAILED (an error with the
// reason). A step that fails is retried with backoff; one whose failure is
// permanent fails the machine.
func drive(ctx context.Context, m *machine, steps enrolSteps, bo *backoff.Backoff, log *slog.Logger) error {
	lastErr := ""
	for {
		st := m.State()
		var next State
		var work func(context.Context) error
		switch st {
		case StateRunning:
			return nil
		case StateFailed:
			rec, _ := m.record()
			return fmt.Errorf("enrolment failed: %s", rec.Reason)
		case StateNew:
			n, w, err := steps.choose()
			if err != nil {
				m.fail(err.Error())
				continue
			}
			next, work = n, w
		case StateBootstrapping:
			next, work = StateRunning, steps.bootstrap
		case StateRegistering:
			next, work = StateWaitingForApproval, steps.register
		case StateWaitingForApproval:
			next, work = StateCommitting, steps.awaitApproval
		case StateCommitting:
			next, work = StateRunning, steps.commit
		default:
			m.fail(fmt.Sprintf("unknown enrolment state %q", st))
			continue
		}
		err := m.advance(ctx, next, work)
		switch {
		case err == nil:
			bo.Reset()
			lastErr = ""
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errForbidden):
			// advance failed the machine; the next round reports it.
			if m.State() != StateFailed {
				m.fail(err.Error())
			}
		case isPermanent(err):
			m.fail(err.Error())
		default:
			m.setNote(err.Error())
			if err.Error() != lastErr {
				log.Warn("enrolment step failed; retrying", "state", st, "err", err)
			} else {
				log.Debug("enrolment step failed again; retrying", "state", st, "err", err)
			}
			lastErr = err.Error()
			if !run.Sleep(ctx, bo.After(err)) {
				return ctx.Err()
			}
		}
	}
}

// runEnrolment drives the machine; once it is RUNNING the rest of the agent
// starts (s.enrolled). A FAILED machine leaves the agent idle: GetStatus
// says why.
func (s *Service) runEnrolment(ctx context.Context) error {
	e := &enroller{s: s}
	defer e.close()
	err := drive(ctx, s.machine, e, backoff.New(retryMin, s.cfg.RetryMax), s.log.With("part", "enrolment"))
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		s.log.Error("enrolment failed: the agent stays idle; a new node needs a new data dir", "err", err)
		<-ctx.Done()
		return nil
	}
	if err := e.recommitExpired(ctx); err != nil {
		return nil // ctx ended
	}
	e.close()
	s.log.Info("node enrolled: following its roles")
	close(s.enrolled)
	<-ctx.Done()
	return nil
}

// recommitExpired gets a new node certificate for an enrolled node whose
// certificate expired while the agent was down (it renews after two thirds
// of the life, but only while it runs): CommitNode with the node key, as
// in enrolment; the curator revokes the certificate it replaces. It
// retries until it has one or ctx ends.
func (e *enroller) recommitExpired(ctx context.Context) error {
	s := e.s
	s.connMu.Lock()
	has := s.creds != nil
	s.connMu.Unlock()
	bo := backoff.New(retryMin, s.cfg.RetryMax)
	for !has {
		err := e.commit(ctx)
		if err == nil {
			return nil
		}
		s.log.Warn("the node certificate expired while the agent was down; committing again", "err", err)
		if !run.Sleep(ctx, bo.Next()) {
			return ctx.Err()
		}
	}
	return nil
}

// enroller does the enrolment steps.
type enroller struct {
	s *Service
	// enrolling are connections with the self-signed certificate of the
	// node key, one per curator replica, dialled when first used.
	enrolling []*grpc.ClientConn
	// replica is the curator replica tried next; it moves on when one
	// does not answer (followers forward to the leader, so any works).
	replica int
	// rev is where the approval watch resumes.
	rev int64
}

func (e *enroller) close() {
	for i, cc := range e.enrolling {
		if cc != nil {
			cc.Close()
		}
		e.enrolling[i] = nil
	}
}

// curator is the Curator API of the current replica with the self-signed
// certificate of the node key (rpc.DialEnrolling).
func (e *enroller) curator() (curatorv1.CuratorClient, string, error) {
	addrs := e.s.cfg.Curators
	if e.enrolling == nil {
		e.enrolling = make([]*grpc.ClientConn, len(addrs))
	}
	i := e.replica % len(addrs)
	if e.enrolling[i] == nil {
		cc, err := rpc.DialEnrolling(addrs[i], e.s.caPEM, e.s.key, []pki.Kind{pki.KindCurator})
		if err != nil {
			return nil, addrs[i], fmt.Errorf("dial curator %s: %w", addrs[i], err)
		}
		e.enrolling[i] = cc
	}
	return curatorv1.NewCuratorClient(e.enrolling[i]), addrs[i], nil
}

// failed notes a failed call: a replica that did not answer is skipped
// next time.
func (e *enroller) failed(err error) {
	if transient(err) {
		e.replica++
	}
}

func (e *enroller) choose() (State, func(context.Context) error, error) {
	cfg := e.s.cfg
	switch {
	case cfg.Bootstrap:
		return StateBootstrapping, e.prepareBootstrap, nil
	case cfg.RegisterTicket != "" || cfg.RegisterTicketFile != "":
		return StateRegistering, nil, nil
	}
	return "", nil, errors.New("neither --bootstrap nor a register ticket was given")
}

// prepareBootstrap (NEW → BOOTSTRAPPING) stores the bootstrap certificate
// as the node certificate, so that BOOTSTRAPPING resumes after a restart
// without the --bootstrap flags.
func (e *enroller) prepareBootstrap(context.Context) error {
	c := e.s.bootstrapCreds
	if c == nil {
		return permanent(errors.New("--bootstrap without a checked --bootstrap-cert"))
	}
	if err := e.s.files.storeNodeCreds(c); err != nil {
		return err
	}
	e.s.setCreds(c.creds)
	return nil
}

// bootstrap starts the local consensus as a new cluster, once in the
// node's life (bootstrapLocal), and records the node with the curator
// (idempotent: already_bootstrapped).
func (e *enroller) bootstrap(ctx context.Context) error {
	s := e.s
	cons, err := s.localConsensus()
	if err != nil {
		return err
	}
	st, err := bootstrapLocal(ctx, s.machine, cons, s.id, s.cfg.Consensus, s.log.With("part", "enrolment"))
	if err != nil {
		return err
	}
	cur, err := s.curatorClient()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	s.connMu.Lock()
	nodeCert := pki.EncodeCertPEM(s.creds.Certificate().Certificate[0])
	s.connMu.Unlock()
	resp, err := cur.BootstrapCluster(cctx, &curatorv1.BootstrapClusterRequest{
		PublicKey: s.key.Public().(ed25519.PublicKey),
		Status:    s.statusFrom(st),
		// Recorded, so that deleting this node revokes them too; the
		// member certificate goes into the role.
		Certificates: nonEmpty(nodeCert, st.GetCertificate(), st.GetMemberCertificate()),
		Labels:       s.cfg.Labels,
	})
	if err != nil {
		err = fmt.Errorf("bootstrap the cluster on the curator: %w", err)
		switch status.Code(err) {
		case codes.FailedPrecondition, codes.PermissionDenied, codes.InvalidArgument:
			// The cluster exists already (another node bootstrapped it),
			// or the curator refuses this node: retrying changes nothing.
			return permanent(err)
		}
		return err
	}
	s.log.Info("cluster bootstrapped", "already_bootstrapped", resp.GetAlreadyBootstrapped(), "roles", roleNames(resp.GetNode().GetRoles()))
	return nil
}

// bootstrapLocal has the local consensus (cons, at addr) run the cluster's
// first member, and makes sure it is bootstrapped at most once in the
// node's life, whatever crashes and data losses come between. Its record
// (machine.setBootstrap) is written in two steps around Start(bootstrap):
//
//  1. Begun, before the first Start(bootstrap). Were it written after
//     the call, a crash between the call and the write followed by the
//     loss of the consensus data would leave no trace of the member, and
//     the restarted agent would bootstrap again. Written before, an
//     empty (IDLE) local consensus with this record is never
//     bootstrapped again. The price: a crash between the write and the
//     call, or a call that never reached the consensus before it
//     restarted empty, ends in FAILED too — for a cluster that never
//     existed, where starting over with new data dirs costs little,
//     unlike a second cluster. A start that failed (FAILED, STOPPED) is
//     retried: consensus refuses Start while it holds data.
//  2. The member and cluster ids, once the member runs, before the
//     curator hears of the cluster (BootstrapCluster) and so before any
//     other node can join it: the reason an operator reads then names
//     the member that was lost, and a restored member is checked to be
//     that one.
//
// The plan is planBootstrap's; it returns the running member's status.
func bootstrapLocal(ctx context.Context, m *machine, cons localConsensus, nodeID, addr string, log *slog.Logger) (*consensusv1.StatusResponse, error) {
	st, err := consensusStatus(ctx, cons, nodeID, addr)
	if err != nil {
		return nil, err
	}
	rec := m.bootstrap()
	step, err := planBootstrap(rec, st)
	if err != nil {
		return nil, err
	}
	switch step {
	case bootstrapWait:
		if rec.confirmed() {
			return nil, fmt.Errorf("the member this node bootstrapped (%s) is %s (%s): waiting for the local consensus to restart it from its data; it is never bootstrapped again", rec.MemberID, st.GetState(), st.GetStateReason())
		}
		return nil, fmt.Errorf("local consensus is %s (%s): waiting for it to run", st.GetState(), st.GetStateReason())
	case bootstrapStart:
		if rec == nil {
			rec = &bootstrapRecord{Begun: time.Now().UTC()}
			if err := m.setBootstrap(*rec); err != nil {
				return nil, fmt.Errorf("record the bootstrap before starting it: %w", err)
			}
		}
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		resp, err := cons.Start(sctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Bootstrap{Bootstrap: &consensusv1.Bootstrap{}}})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("start the local consensus as a new cluster: %w", err)
		}
		st = resp.GetStatus()
		log.Info("local consensus bootstrapped a new cluster", "member", fmt.Sprintf("%x", st.GetMemberId()), "already_started", resp.GetAlreadyStarted())
		if st.GetState() != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
			return nil, fmt.Errorf("local consensus is %s (%s): waiting for it to run", st.GetState(), st.GetStateReason())
		}
	}
	if !rec.confirmed() {
		now := time.Now().UTC()
		b := bootstrapRecord{Begun: now, MemberID: fmt.Sprintf("%x", st.GetMemberId()), ClusterID: fmt.Sprintf("%x", st.GetClusterId()), Confirmed: now}
		if rec != nil {
			b.Begun = rec.Begun
		}
		if err := m.setBootstrap(b); err != nil {
			return nil, fmt.Errorf("record the bootstrapped member: %w", err)
		}
		log.Info("bootstrap member recorded: the local consensus is never bootstrapped again", "member", b.MemberID, "cluster", b.ClusterID)
	}
	return st, nil
}

// bootstrapStep is what the bootstrap step does next.
type bootstrapStep int

const (
	// bootstrapStart: record the start (unless recorded), Start(bootstrap).
	bootstrapStart bootstrapStep = iota
	// bootstrapWait: the member is starting, or stopped or failed: wait
	// for it to run.
	bootstrapWait
	// bootstrapRunning: the member runs: record it (unless recorded), go
	// on to the curator.
	bootstrapRunning
)

// planBootstrap decides the bootstrap step from the record (nil: never
// begun) and the local consensus's status. Its errors are permanent: the
// node's first member is lost or replaced, and only an operator can
// decide what to do.
func planBootstrap(rec *bootstrapRecord, st *consensusv1.StatusResponse) (bootstrapStep, error) {
	switch st.GetState() {
	case consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING:
		if id, cluster := fmt.Sprintf("%x", st.GetMemberId()), fmt.Sprintf("%x", st.GetClusterId()); rec.confirmed() && (id != rec.MemberID || cluster != rec.ClusterID) {
			return 0, permanent(fmt.Errorf("the local consensus runs etcd member %s of cluster %s, but this node bootstrapped the cluster as member %s of cluster %s: its data was replaced. "+
				"Restore the consensus data dir of member %s and restart this agent with a new data dir, the same node key and --bootstrap; or start a new node with new data dirs", id, cluster, rec.MemberID, rec.ClusterID, rec.MemberID))
		}
		return bootstrapRunning, nil
	case consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE:
		switch {
		case rec.confirmed():
			return 0, permanent(fmt.Errorf("refusing to bootstrap a second cluster: this node bootstrapped the cluster as etcd member %s of cluster %s (%s), but its local consensus is empty now: the member's data was lost or wiped. "+
				"Restore the consensus data dir from a backup and restart this agent with a new data dir, the same node key and --bootstrap; or start a new node with new data dirs (and remove this node from the cluster if other members survive)",
				rec.MemberID, rec.ClusterID, rec.Confirmed.Format(time.RFC3339)))
		case rec != nil:
			return 0, permanent(fmt.Errorf("refusing to bootstrap a second cluster: this node began bootstrapping the cluster at %s and never saw its member run, and its local consensus is empty now: whether a member was created and its data lost cannot be told. "+
				"If it held a member, restore the consensus data dir and restart this agent with a new data dir, the same node key and --bootstrap; if not, start over the same way with the empty consensus",
				rec.Begun.Format(time.RFC3339)))
		}
		return bootstrapStart, nil
	case consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED, consensusv1.LifecycleState_LIFECYCLE_STATE_FAILED:
		if rec.confirmed() {
			// Its data restarts it (the consensus service does that);
			// starting anything here could only create a new cluster.
			return bootstrapWait, nil
		}
		// A start that failed: consensus refuses Start while it holds
		// data, so this only retries a bootstrap that never ran.
		return bootstrapStart, nil
	}
	return bootstrapWait, nil
}

// ticket is the register ticket: from --register-ticket, or read from
// --register-ticket-file now (the file may appear after the agent started).
func (e *enroller) ticket() ([]byte, error) {
	cfg := e.s.cfg
	if cfg.RegisterTicket != "" {
		return decodeTicket(cfg.RegisterTicket)
	}
	if cfg.RegisterTicketFile == "" {
		return nil, errors.New("no register ticket: restart with --register-ticket or --register-ticket-file")
	}
	// Whoever writes the file (curia-local, a deployment's job) does so
	// once the cluster is up: look again soon, not on a doubling backoff.
	b, err := os.ReadFile(cfg.RegisterTicketFile)
	if err != nil {
		return nil, rpcerr.RetryAfter(fmt.Errorf("waiting for the register ticket: %w", err), ticketPoll)
	}
	if len(b) == 0 {
		return nil, rpcerr.RetryAfter(fmt.Errorf("waiting for the register ticket: %s is empty", cfg.RegisterTicketFile), ticketPoll)
	}
	return b, nil
}

// register registers the node with the ticket (idempotent while the node is
// NEW; a node registered before learns its state).
func (e *enroller) register(ctx context.Context) error {
	s := e.s
	ticket, err := e.ticket()
	if err != nil {
		return err
	}
	cur, addr, err := e.curator()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := cur.RegisterNode(cctx, &curatorv1.RegisterNodeRequest{
		RegisterTicket: ticket,
		Labels:         s.cfg.Labels,
		PublicKey:      s.key.Public().(ed25519.PublicKey),
	})
	if err != nil {
		e.failed(err)
		return fmt.Errorf("register with curator %s: %w", addr, err)
	}
	if st := resp.GetNode().GetState(); st == curatorv1.NodeState_NODE_STATE_DECOMMISSIONED {
		return permanent(fmt.Errorf("the cluster knows this node as %s", st))
	}
	s.log.Info("node registered", "state", resp.GetNode().GetState(), "labels", sortedLabels(s.cfg.Labels))
	return nil
}

// awaitApproval watches the node's own record (Watch with the self-signed
// certificate, resumable) until an admin approved it (STANDBY) or it is UP
// already.
func (e *enroller) awaitApproval(ctx context.Context) error {
	s := e.s
	cur, addr, err := e.curator()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cur.Watch(wctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: s.id}, StartRevision: e.rev})
	if err != nil {
		e.failed(err)
		return fmt.Errorf("watch this node on curator %s: %w", addr, err)
	}
	s.machine.setNote("waiting for an admin to approve the node (Management/ApproveNode)")
	for {
		resp, err := stream.Recv()
		if err != nil {
			e.failed(err)
			return fmt.Errorf("watch this node on curator %s: %w", addr, err)
		}
		for _, n := range resp.GetNodes() {
			if n.GetId() != s.id {
				continue
			}
			switch n.GetState() {
			case curatorv1.NodeState_NODE_STATE_STANDBY, curatorv1.NodeState_NODE_STATE_UP:
				s.log.Info("node approved", "state", n.GetState())
				return nil
			case curatorv1.NodeState_NODE_STATE_DECOMMISSIONED:
				return permanent(fmt.Errorf("the node was decommissioned while waiting for approval"))
			}
		}
		for _, id := range resp.GetDeleted() {
			if id == s.id {
				return permanent(errors.New("the node was deleted while waiting for approval (rejected)"))
			}
		}
		if resp.GetRevision() != 0 {
			e.rev = resp.GetRevision()
		}
	}
}

// commit fetches the node certificate (CommitNode) and stores it with the
// node key; from then on the agent uses only that certificate. A
// certificate stored before a crash is used as is.
func (e *enroller) commit(ctx context.Context) error {
	s := e.s
	if c, err := loadNodeCreds(s.cfg.Cluster, s.caPEM, s.files.nodeCert, s.files.nodeKey, s.id); err == nil {
		s.log.Info("node certificate found: committed before the last restart")
		s.setCreds(c.creds)
		return nil
	}
	cur, addr, err := e.curator()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := cur.CommitNode(cctx, &curatorv1.CommitNodeRequest{})
	if err != nil {
		e.failed(err)
		return fmt.Errorf("commit on curator %s: %w", addr, err)
	}
	keyPEM, err := pki.MarshalEd25519PEM(s.key)
	if err != nil {
		return err
	}
	c, err := checkNodeCreds(s.cfg.Cluster, s.caPEM, resp.GetCertificate(), keyPEM, s.id)
	if err != nil {
		return permanent(fmt.Errorf("the certificate CommitNode issued: %w", err))
	}
	if err := s.files.storeNodeCreds(c); err != nil {
		return err
	}
	s.setCreds(c.creds)
	s.log.Info("node committed: it has its certificate", "serial", resp.GetNode().GetCertificateSerial())
	return nil
}

// nonEmpty drops the empty ones.
func nonEmpty(bs ...[]byte) [][]byte {
	var out [][]byte
	for _, b := range bs {
		if len(b) > 0 {
			out = append(out, b)
		}
	}
	return out
}

// roleNames renders roles for logs.
func roleNames(r *curatorv1.Roles) []string {
	var out []string
	if r.GetConsensusMember() != nil {
		out = append(out, "ConsensusMember")
	}
	if r.GetKubernetesController() != nil {
		out = append(out, "KubernetesController")
	}
	if r.GetKubernetesWorker() != nil {
		out = append(out, "KubernetesWorker")
	}
	return out
}
