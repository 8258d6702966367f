package rpc

import (
	"context"
	"errors"
	"testing"

	"curia.dev/platform/pki"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPolicyAuthorize(t *testing.T) {
	policy := Policy{
		"/curia.test.v1.Nodes/Update": {
			Allow: []pki.Kind{pki.KindAdmin, pki.KindNode},
			Check: func(ctx context.Context, p pki.Principal, req any) error {
				if got, ok := PrincipalFromContext(ctx); !ok || got != p {
					return status.Error(codes.Internal, "principal not in context")
				}
				switch {
				case req == "missing":
					return status.Error(codes.NotFound, "no such node")
				case p.Kind == pki.KindNode && req != p.Name:
					return errors.New("a node may only act on itself")
				}
				return nil
			},
		},
		"/curia.test.v1.Nodes/List":     {Allow: []pki.Kind{pki.KindAdmin}},
		"/curia.test.v1.Nodes/Register": {Allow: []pki.Kind{pki.KindEnrolling}},
	}
	newcomer := pki.Principal{Kind: pki.KindEnrolling, Name: node1.Name}
	tests := map[string]struct {
		method   string
		who      pki.Principal
		req      any
		wantCode codes.Code
		wantMsg  string
	}{
		"allowed without check":         {method: "/curia.test.v1.Nodes/List", who: admin, wantCode: codes.OK},
		"allowed by check":              {method: "/curia.test.v1.Nodes/Update", who: node1, req: node1.Name, wantCode: codes.OK},
		"refused by check":              {method: "/curia.test.v1.Nodes/Update", who: node1, req: node2.Name, wantCode: codes.PermissionDenied, wantMsg: "principal " + node1.String() + " may not call /curia.test.v1.Nodes/Update: a node may only act on itself"},
		"check returns a status":        {method: "/curia.test.v1.Nodes/Update", who: admin, req: "missing", wantCode: codes.NotFound, wantMsg: "no such node"},
		"kind not allowed":              {method: "/curia.test.v1.Nodes/List", who: node1, wantCode: codes.PermissionDenied, wantMsg: "principal " + node1.String() + " may not call /curia.test.v1.Nodes/List"},
		"method not in policy":          {method: "/curia.test.v1.Nodes/Delete", who: admin, wantCode: codes.PermissionDenied, wantMsg: "method /curia.test.v1.Nodes/Delete is not in the authorization policy"},
		"health for anyone":             {method: "/grpc.health.v1.Health/Check", who: reconciler, wantCode: codes.OK},
		"reflection v1":                 {method: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", who: node1, wantCode: codes.OK},
		"reflection v1alpha":            {method: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", who: node1, wantCode: codes.OK},
		"lookalike of health":           {method: "/grpc.health.v1.HealthX/Check", who: admin, wantCode: codes.PermissionDenied},
		"enrolling node allowed":        {method: "/curia.test.v1.Nodes/Register", who: newcomer, wantCode: codes.OK},
		"enrolling node elsewhere":      {method: "/curia.test.v1.Nodes/Update", who: newcomer, req: node1.Name, wantCode: codes.PermissionDenied, wantMsg: "enrolling node " + node1.Name + " may only call methods open to enrolling nodes, not /curia.test.v1.Nodes/Update"},
		"no health for enrolling nodes": {method: "/grpc.health.v1.Health/Check", who: newcomer, wantCode: codes.PermissionDenied},
		"enrolling node, unlisted":      {method: "/curia.test.v1.Nodes/Delete", who: newcomer, wantCode: codes.PermissionDenied},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := WithPrincipal(context.Background(), tc.who)
			err := policy.Authorize(ctx, tc.method, tc.who, tc.req)
			st, _ := status.FromError(err)
			if st.Code() != tc.wantCode || (tc.wantMsg != "" && st.Message() != tc.wantMsg) {
				t.Fatalf("Authorize = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

func TestPrincipalFromContext(t *testing.T) {
	if _, ok := PrincipalFromContext(context.Background()); ok {
		t.Fatal("principal in an empty context")
	}
	if got, ok := PrincipalFromContext(WithPrincipal(context.Background(), admin)); !ok || got != admin {
		t.Fatalf("PrincipalFromContext = %v, %v", got, ok)
	}
}
