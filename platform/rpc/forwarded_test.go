package rpc

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"curia.dev/platform/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// forwarding returns a context that forwards as "principal" each of values,
// raw, so that tests can send what ForwardedContext never would.
func forwarding(ctx context.Context, values ...string) context.Context {
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, ForwardedPrincipalHeader, v)
	}
	return ctx
}

func TestServerForwardedPrincipal(t *testing.T) {
	env := startServer(t, func(cfg *ServerConfig) { cfg.TrustForwardedFrom = []pki.Kind{pki.KindCurator} })
	asCurator := func(t *testing.T) *grpc.ClientConn { return env.dial(t, curator) }
	asAdmin := func(t *testing.T) *grpc.ClientConn { return env.dial(t, admin) }
	node := enrolling(newNodeKey(t))

	tests := map[string]struct {
		conn      func(t *testing.T) *grpc.ClientConn
		forwarded []string
		method    string
		value     string
		wantCode  codes.Code
		wantMsg   string // part of the status message, or the reply if OK
	}{
		"forwarded admin": {
			conn: asCurator, forwarded: []string{admin.String()}, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.OK, wantMsg: "admin/alice:hello via curator",
		},
		"forwarded node acting on itself": {
			conn: asCurator, forwarded: []string{node1.String()}, method: echoMethod("Echo"), value: node1.Name,
			wantCode: codes.OK, wantMsg: node1.String() + ":" + node1.Name + " via curator",
		},
		"forwarded node acting on another node": {
			conn: asCurator, forwarded: []string{node1.String()}, method: echoMethod("Echo"), value: node2.Name,
			wantCode: codes.PermissionDenied, wantMsg: "principal " + node1.String() + " may not call /curia.test.v1.Echo/Echo: a node may only act on itself",
		},
		"forwarded kind not allowed": {
			conn: asCurator, forwarded: []string{reconciler.String()}, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.PermissionDenied, wantMsg: "principal reconciler may not call /curia.test.v1.Echo/Echo",
		},
		"forwarded enrolling node, method open to it": {
			conn: asCurator, forwarded: []string{node.String()}, method: echoMethod("Register"), value: "hello",
			wantCode: codes.OK, wantMsg: node.String() + ":hello via curator",
		},
		"forwarded enrolling node, other method": {
			conn: asCurator, forwarded: []string{node.String()}, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.PermissionDenied, wantMsg: "enrolling node " + node.Name + " may only call",
		},
		"no header: the direct principal": {
			conn: asCurator, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.PermissionDenied, wantMsg: "principal curator may not call /curia.test.v1.Echo/Echo",
		},
		"no header, allowed": {
			conn: asAdmin, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.OK, wantMsg: "admin/alice:hello",
		},
		"untrusted peer sends the header": {
			conn: asAdmin, forwarded: []string{node1.String()}, method: echoMethod("Echo"), value: node1.Name,
			wantCode: codes.PermissionDenied, wantMsg: "principal admin/alice may not forward calls",
		},
		"malformed forwarded principal": {
			conn: asCurator, forwarded: []string{"root"}, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.Unauthenticated, wantMsg: `forwarded principal: unknown principal kind "root"`,
		},
		"two forwarded principals": {
			conn: asCurator, forwarded: []string{admin.String(), node1.String()}, method: echoMethod("Echo"), value: "hello",
			wantCode: codes.Unauthenticated, wantMsg: "2 forwarded principals, want one",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := forwarding(testContext(t), tc.forwarded...)
			got, err := callEcho(ctx, tc.conn(t), tc.method, tc.value)
			wantCode(t, err, tc.wantCode, tc.wantMsg)
			if tc.wantCode == codes.OK && got != tc.wantMsg {
				t.Fatalf("reply %q, want %q", got, tc.wantMsg)
			}
		})
	}

	// The log line names both.
	found := false
	for line := range strings.Lines(env.logs.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "finished call" && rec["principal"] == admin.String() && rec["forwarded_by"] == curator.String() {
			found = true
		}
	}
	if !found {
		t.Fatalf("no log line with principal %s forwarded by %s:\n%s", admin, curator, env.logs)
	}
}

func TestServerStreamForwarded(t *testing.T) {
	env := startServer(t, func(cfg *ServerConfig) { cfg.TrustForwardedFrom = []pki.Kind{pki.KindCurator} })
	tests := map[string]struct {
		as       pki.Principal
		value    string
		wantCode codes.Code
		wantMsg  string
	}{
		"trusted forwarder":      {as: curator, value: node1.Name, wantCode: codes.OK, wantMsg: node1.String() + ":" + node1.Name + " via curator"},
		"check on the request":   {as: curator, value: node2.Name, wantCode: codes.PermissionDenied, wantMsg: "a node may only act on itself"},
		"untrusted peer":         {as: admin, value: node1.Name, wantCode: codes.PermissionDenied, wantMsg: "principal admin/alice may not forward calls"},
		"forwarder not a caller": {as: node2, value: node1.Name, wantCode: codes.PermissionDenied, wantMsg: "principal " + node2.String() + " may not forward calls"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			got, err := openWatch(ForwardedContext(ctx, node1), env.dial(t, tc.as), tc.value)
			wantCode(t, err, tc.wantCode, tc.wantMsg)
			if tc.wantCode == codes.OK && got != tc.wantMsg {
				t.Fatalf("reply %q, want %q", got, tc.wantMsg)
			}
		})
	}
}

func TestForwardedContext(t *testing.T) {
	base := metadata.AppendToOutgoingContext(context.Background(), "other", "kept")
	first := ForwardedContext(base, admin)
	second := ForwardedContext(first, node1)

	for ctx, want := range map[context.Context][]string{base: nil, first: {admin.String()}, second: {node1.String()}} {
		md, _ := metadata.FromOutgoingContext(ctx)
		if got := md.Get(ForwardedPrincipalHeader); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("forwarded principals %q, want %q", got, want)
		}
		if got := md.Get("other"); len(got) != 1 {
			t.Errorf("other metadata %q, want kept", got)
		}
	}

	if _, ok := ForwarderFromContext(context.Background()); ok {
		t.Fatal("forwarder in an empty context")
	}
	if got, ok := ForwarderFromContext(WithForwarder(context.Background(), curator)); !ok || got != curator {
		t.Fatalf("ForwarderFromContext = %v, %v", got, ok)
	}
}
