package reconciler

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/services/reconciler/internal/plan"
)

// TestActionKinds: every kind the planner has is an ActionKind of the API,
// each a different one.
func TestActionKinds(t *testing.T) {
	seen := map[reconcilerv1.ActionKind]plan.Kind{}
	for k := plan.None; k <= plan.Promote; k++ {
		got := toProto(&plan.Action{Kind: k}).GetKind()
		if got == reconcilerv1.ActionKind_ACTION_KIND_UNSPECIFIED {
			t.Errorf("plan kind %s has no ActionKind", k)
		}
		if other, ok := seen[got]; ok {
			t.Errorf("plan kinds %s and %s are both %s", other, k, got)
		}
		seen[got] = k
	}
}

// TestStatusOfPasses: how a pass ended is the enum, the words are the
// detail, and refusals keep the last few with what the planner knew.
func TestStatusOfPasses(t *testing.T) {
	r := &Reconciler{
		log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		metrics: newMetrics(prometheus.NewRegistry()),
		status:  &reconcilerv1.GetStatusResponse{},
	}
	refuse := plan.Action{Kind: plan.Refuse, Refused: plan.RemoveMember, MemberID: 2, NodeID: "b", Reason: "below the floor"}
	for range maxRefusals + 2 {
		r.refused(refuse)
	}
	st := r.status
	if st.LastResult != reconcilerv1.PassResult_PASS_RESULT_REFUSED || st.LastResultDetail != refuse.Reason {
		t.Fatalf("after a refusal: %s %q", st.LastResult, st.LastResultDetail)
	}
	if len(st.Refusals) != maxRefusals {
		t.Fatalf("%d refusals kept, want %d", len(st.Refusals), maxRefusals)
	}
	last := st.Refusals[len(st.Refusals)-1]
	if last.Reason != refuse.Reason || last.RefusedKind != reconcilerv1.ActionKind_ACTION_KIND_REMOVE_MEMBER ||
		last.MemberId != 2 || last.NodeId != "b" || last.Time == nil {
		t.Fatalf("refusal %v", last)
	}
	if st.Planned.GetKind() != reconcilerv1.ActionKind_ACTION_KIND_REFUSE {
		t.Fatalf("planned %v", st.Planned)
	}

	// A refusal before any action was chosen names no refused kind.
	r.refused(plan.Action{Kind: plan.Refuse, Reason: "mapping looks broken"})
	if k := st.Refusals[len(st.Refusals)-1].RefusedKind; k != reconcilerv1.ActionKind_ACTION_KIND_UNSPECIFIED {
		t.Fatalf("refused kind %s, want unspecified", k)
	}

	acted := plan.Action{Kind: plan.Promote, MemberID: 3, NodeID: "c", Reason: "caught up"}
	r.finish(reconcilerv1.PassResult_PASS_RESULT_ACTED, acted.String(), &acted, &acted)
	if st.LastResult != reconcilerv1.PassResult_PASS_RESULT_ACTED || st.LastResultDetail != acted.String() ||
		st.LastAction.GetKind() != reconcilerv1.ActionKind_ACTION_KIND_PROMOTE || st.Actions != 1 {
		t.Fatalf("after acting: %v", st)
	}
}
