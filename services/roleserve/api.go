package roleserve

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/services/roleserve/internal/reduce"
)

// apiConsensusTimeout bounds GetStatus's call to the local consensus.
const apiConsensusTimeout = 3 * time.Second

// policy: the node agent's API is for admins.
func policy() rpc.Policy {
	p := rpc.Policy{}
	for _, m := range roleservev1.RoleServer_ServiceDesc.Methods {
		p["/"+roleservev1.RoleServer_ServiceDesc.ServiceName+"/"+m.MethodName] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	}
	return p
}

// serveAPI serves RoleServer (with health and reflection) once the node
// has its certificate, which is the server's identity; it calls ready once
// it listens.
func (s *Service) serveAPI(ctx context.Context, ready func()) error {
	if !waitFor(ctx, s.credsReady) {
		return nil
	}
	s.connMu.Lock()
	creds := s.creds
	s.connMu.Unlock()
	srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: creds, Policy: policy(), Logger: s.log.With("part", "grpc"), IsRevoked: s.crl.IsRevoked, Health: s.health, Registry: s.registry})
	if err != nil {
		return err
	}
	roleservev1.RegisterRoleServerServer(srv.GRPC(), &apiServer{s: s})
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	ready()
	s.log.Info("node agent API serving", "listen", lis.Addr().String())
	return srv.Serve(ctx, lis)
}

// apiServer implements curia.roleserve.v1.RoleServer.
type apiServer struct {
	roleservev1.UnimplementedRoleServerServer
	s *Service
}

var enrolmentStates = map[State]roleservev1.EnrolmentState{
	StateNew:                roleservev1.EnrolmentState_ENROLMENT_STATE_NEW,
	StateBootstrapping:      roleservev1.EnrolmentState_ENROLMENT_STATE_BOOTSTRAPPING,
	StateRegistering:        roleservev1.EnrolmentState_ENROLMENT_STATE_REGISTERING,
	StateWaitingForApproval: roleservev1.EnrolmentState_ENROLMENT_STATE_WAITING_FOR_APPROVAL,
	StateCommitting:         roleservev1.EnrolmentState_ENROLMENT_STATE_COMMITTING,
	StateRunning:            roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING,
	StateFailed:             roleservev1.EnrolmentState_ENROLMENT_STATE_FAILED,
}

var consensusModes = map[reduce.Mode]roleservev1.ConsensusMode{
	reduce.ModeNone:      roleservev1.ConsensusMode_CONSENSUS_MODE_NONE,
	reduce.ModeBootstrap: roleservev1.ConsensusMode_CONSENSUS_MODE_BOOTSTRAP,
	reduce.ModeJoin:      roleservev1.ConsensusMode_CONSENSUS_MODE_JOIN,
}

func (x *apiServer) GetStatus(ctx context.Context, _ *roleservev1.GetStatusRequest) (*roleservev1.GetStatusResponse, error) {
	s := x.s
	rec, note := s.machine.record()
	reason := rec.Reason
	if reason == "" {
		reason = note
	}
	resp := &roleservev1.GetStatusResponse{
		NodeId:              s.id,
		EnrolmentState:      enrolmentStates[rec.State],
		EnrolmentReason:     reason,
		Bootstrapped:        rec.Bootstrapped,
		ConsensusConfigured: s.cfg.Consensus != "",
	}
	s.mu.Lock()
	st := s.st // the records in it are replaced, never changed
	s.mu.Unlock()
	if r := st.node.GetRoles(); r != nil {
		resp.Roles = proto.Clone(r).(*curatorv1.Roles)
	}
	resp.RolesSource = st.rolesSource
	resp.RolesRevision = st.node.GetRevision()
	resp.Decision = &roleservev1.Decision{
		Decided:      st.decision.Decided,
		RunConsensus: st.decision.Run,
		Reason:       st.decision.Reason,
		IgnoredInput: st.ignored,
	}
	if st.decision.Decided {
		resp.Decision.Mode = consensusModes[st.decision.Mode]
		resp.Decision.Since = timestamppb.New(st.since)
	}
	if resp.Decision.Reason == "" {
		resp.Decision.Reason = st.ignored
	}
	resp.Launcher = &roleservev1.Launcher{Phase: st.launcher.phase, LastError: st.launcher.lastError, Attempts: st.launcher.attempts}
	resp.CuratorConnected = st.connected
	if !st.lastHeartbeat.IsZero() {
		resp.LastHeartbeat = timestamppb.New(st.lastHeartbeat)
	}
	if st.reported != nil {
		resp.ReportedStatus = proto.Clone(st.reported).(*curatorv1.NodeStatus)
	}
	cctx, cancel := context.WithTimeout(ctx, apiConsensusTimeout)
	defer cancel()
	if s.cfg.Consensus == "" {
		resp.ConsensusError = "no local consensus is configured (--consensus)"
	} else if cs, err := s.localConsensusStatus(cctx); err != nil {
		resp.ConsensusError = err.Error()
	} else {
		resp.Consensus = cs
	}
	return resp, nil
}
