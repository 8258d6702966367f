package reconciler

import (
	"context"

	"google.golang.org/protobuf/proto"

	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	"curia.dev/services/reconciler/internal/plan"
)

// policy: the reconciler's API is for admins.
func policy() rpc.Policy {
	p := rpc.Policy{}
	for _, m := range reconcilerv1.Reconciler_ServiceDesc.Methods {
		p["/"+reconcilerv1.Reconciler_ServiceDesc.ServiceName+"/"+m.MethodName] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	}
	return p
}

// apiServer implements curia.reconciler.v1.Reconciler.
type apiServer struct {
	reconcilerv1.UnimplementedReconcilerServer
	r *Reconciler
}

func (x *apiServer) GetStatus(context.Context, *reconcilerv1.GetStatusRequest) (*reconcilerv1.GetStatusResponse, error) {
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	return proto.Clone(x.r.status).(*reconcilerv1.GetStatusResponse), nil
}

// Plan observes and plans now, on any replica, without acting: the next
// action and the whole sequence, under the stored cluster configuration or
// a proposed change of it.
func (x *apiServer) Plan(ctx context.Context, req *reconcilerv1.PlanRequest) (*reconcilerv1.PlanResponse, error) {
	snap, err := x.r.observe(ctx)
	if err != nil {
		return nil, err
	}
	cc := snap.config
	if paths := req.GetProposedMask().GetPaths(); len(paths) > 0 {
		if cc, err = records.ClusterConfigWithMask(cc, req.GetProposed(), paths); err != nil {
			return nil, err
		}
		if err := records.CheckClusterConfig(cc); err != nil {
			return nil, err
		}
	}
	// The sequence's first step is the action the next pass would take.
	steps := plan.Sequence(snap.observed, x.r.cfg.planConfig(cc))
	resp := &reconcilerv1.PlanResponse{Action: toProto(&steps[0].Action), Members: int64(len(snap.observed.Members)), Nodes: int64(len(snap.observed.Nodes)), Config: cc}
	for _, s := range steps {
		resp.Steps = append(resp.Steps, &reconcilerv1.PlannedStep{
			Action: toProto(&s.Action), Voters: uint32(s.Voters), HealthyVoters: uint32(s.Healthy), //nolint:gosec // G115: counts of etcd voters
			FailureTolerance: int32(s.FailureTolerance), //nolint:gosec // G115: at most the number of voters
		})
	}
	return resp, nil
}

func (x *apiServer) Pause(_ context.Context, req *reconcilerv1.PauseRequest) (*reconcilerv1.PauseResponse, error) {
	x.r.mu.Lock()
	x.r.status.Paused, x.r.status.PauseReason = true, req.GetReason()
	x.r.mu.Unlock()
	x.r.log.Warn("paused", "reason", req.GetReason())
	return &reconcilerv1.PauseResponse{}, nil
}

func (x *apiServer) Resume(context.Context, *reconcilerv1.ResumeRequest) (*reconcilerv1.ResumeResponse, error) {
	x.r.mu.Lock()
	x.r.status.Paused, x.r.status.PauseReason = false, ""
	x.r.mu.Unlock()
	x.r.log.Info("resumed")
	x.r.kick()
	return &reconcilerv1.ResumeResponse{}, nil
}
