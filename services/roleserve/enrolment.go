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
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

const (
	// callTimeout bounds one call to the curator or the local consensus.
	callTimeout = 30 * time.Second
	// startTimeout bounds a consensus Start (etcd starting, a join
	// catching up with the member list).
	startTimeout = 2 * time.Minute
	// retryMin is the first wait before an attempt is repeated.
	retryMin = 200 * time.Millisecond
)

// enrolSteps is the work of each state of the machine; enroller does it
// against the curator and the local consensus. Every step is idempotent,
// so a step cut short by a crash simply runs again after the restart.
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
func drive(ctx context.Context, m *machine, steps enrolSteps, bo *backoff, log *slog.Logger) error {
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
			bo.reset()
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
			if !sleep(ctx, bo.next()) {
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
	err := drive(ctx, s.machine, e, newBackoff(retryMin, s.cfg.RetryMax), s.log.With("part", "enrolment"))
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		s.log.Error("enrolment failed: the agent stays idle; a new node needs a new data dir", "err", err)
		<-ctx.Done()
		return nil
	}
	e.close()
	s.log.Info("node enrolled: following its roles")
	close(s.enrolled)
	<-ctx.Done()
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

// bootstrap starts the local consensus as a new cluster (idempotent: a
// member that runs is left alone) and records the node with the curator
// (idempotent: already_bootstrapped).
func (e *enroller) bootstrap(ctx context.Context) error {
	s := e.s
	st, err := s.localConsensusStatus(ctx)
	if err != nil {
		return err
	}
	switch st.GetState() {
	case consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING, consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING:
	default:
		_, cons, err := s.conns()
		if err != nil {
			return err
		}
		sctx, cancel := context.WithTimeout(ctx, startTimeout)
		resp, err := consensusv1.NewConsensusClient(cons).Start(sctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Bootstrap{Bootstrap: &consensusv1.Bootstrap{}}})
		cancel()
		if err != nil {
			return fmt.Errorf("start the local consensus as a new cluster: %w", err)
		}
		s.log.Info("local consensus bootstrapped a new cluster", "member", fmt.Sprintf("%x", resp.GetStatus().GetMemberId()), "already_started", resp.GetAlreadyStarted())
		st = resp.GetStatus()
	}
	if st.GetState() != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
		return fmt.Errorf("local consensus is %s (%s): waiting for it to run", st.GetState(), st.GetStateReason())
	}
	cur, err := s.curatorClient()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := cur.BootstrapCluster(cctx, &curatorv1.BootstrapClusterRequest{
		PublicKey: s.key.Public().(ed25519.PublicKey),
		Status:    s.statusFrom(st),
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
	b, err := os.ReadFile(cfg.RegisterTicketFile)
	if err != nil {
		return nil, fmt.Errorf("waiting for the register ticket: %w", err)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("waiting for the register ticket: %s is empty", cfg.RegisterTicketFile)
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
