package reconciler

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
)

// TestRequestContracts: the reconciler's API, served as Run serves it
// (rpc.NewServer with the policy, over mTLS), refuses requests that break
// their contract with InvalidArgument naming the field and the rule, lets
// valid ones through, and tells callers the policy refuses nothing about
// the contract.
func TestRequestContracts(t *testing.T) {
	k := ct.NewPKI(t)
	r := &Reconciler{log: slog.New(slog.DiscardHandler), status: &reconcilerv1.GetStatusResponse{}}
	srv, err := rpc.NewServer(rpc.ServerConfig{Credentials: k.Creds(t, pki.Principal{Kind: pki.KindReconciler}), Policy: policy()})
	if err != nil {
		t.Fatal(err)
	}
	reconcilerv1.RegisterReconcilerServer(srv.GRPC(), &apiServer{r: r})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	client := func(p pki.Principal) reconcilerv1.ReconcilerClient {
		cc, err := rpc.Dial(lis.Addr().String(), rpc.ClientConfig{Credentials: k.Creds(t, p), ServerKinds: []pki.Kind{pki.KindReconciler}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return reconcilerv1.NewReconcilerClient(cc)
	}
	admin := client(pki.Principal{Kind: pki.KindAdmin, Name: "ops"})
	curator := client(pki.Principal{Kind: pki.KindCurator})
	tests := map[string]struct {
		as          reconcilerv1.ReconcilerClient
		reason      string
		code        codes.Code
		field, rule string
	}{
		"too-long reason":           {as: admin, reason: strings.Repeat("x", 1025), code: codes.InvalidArgument, field: "reason", rule: "string.max_bytes"},
		"valid":                     {as: admin, reason: strings.Repeat("x", 1024), code: codes.OK},
		"stranger, too-long reason": {as: curator, reason: strings.Repeat("x", 1025), code: codes.PermissionDenied},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := tc.as.Pause(cctx, &reconcilerv1.PauseRequest{Reason: tc.reason})
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
			fv := rpc.FieldViolations(err)
			if tc.code != codes.InvalidArgument {
				if len(fv) != 0 {
					t.Fatalf("%v: field violations %v", err, fv)
				}
				return
			}
			if !strings.Contains(status.Convert(err).Message(), tc.field+": ") || len(fv) != 1 || fv[0].GetField() != tc.field || fv[0].GetReason() != tc.rule {
				t.Fatalf("%v: field violations %v, want %s breaking %s", err, fv, tc.field, tc.rule)
			}
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.status.Paused || len(r.status.PauseReason) != 1024 {
		t.Fatalf("the valid Pause did not pause: %v", r.status)
	}
}
