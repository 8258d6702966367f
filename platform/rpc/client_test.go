package rpc

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "curia.dev/gen/curia/consensus/v1"
	_ "curia.dev/gen/curia/curator/v1"
	_ "curia.dev/gen/curia/reconciler/v1"
	_ "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
)

func TestClientChecksServerKind(t *testing.T) {
	env := startServer(t, nil) // a curator
	ctx := testContext(t)
	creds := env.ca.creds(t, admin)

	for name, tc := range map[string]struct {
		kinds    []pki.Kind
		wantCode codes.Code
		wantMsg  string
	}{
		"any kind":   {kinds: nil, wantCode: codes.OK},
		"right kind": {kinds: []pki.Kind{pki.KindConsensus, pki.KindCurator}, wantCode: codes.OK},
		"wrong kind": {kinds: []pki.Kind{pki.KindConsensus}, wantCode: codes.Unavailable, wantMsg: "server is curator, want one of [consensus]"},
	} {
		t.Run(name, func(t *testing.T) {
			conn := env.dialConfig(t, ClientConfig{Credentials: creds, ServerKinds: tc.kinds})
			_, err := callEcho(ctx, conn, echoMethod("Echo"), "hello")
			wantCode(t, err, tc.wantCode, tc.wantMsg)
		})
	}

	// A server certificate from another CA is refused whatever its identity.
	other := newTestCA(t)
	foreign := &Credentials{Cluster: testCluster, CAPool: poolOf(other)}
	kp := other.keyPair(t, admin.URI(testCluster).String())
	foreign.cert.Store(&kp)
	conn := env.dialConfig(t, ClientConfig{Credentials: foreign})
	_, err := callEcho(ctx, conn, echoMethod("Echo"), "hello")
	wantCode(t, err, codes.Unavailable, "certificate signed by unknown authority")
}

// TestClientRetriesReads: a method its proto declares without side effects
// is retried on UNAVAILABLE by every client, transparently; any other is
// tried once.
func TestClientRetriesReads(t *testing.T) {
	env := startServer(t, nil)
	ctx := testContext(t)
	conn := env.dialConfig(t, ClientConfig{Credentials: env.ca.creds(t, admin)})

	// Flaky fails twice with UNAVAILABLE, then answers: within 4 attempts.
	if got, err := callEcho(ctx, conn, echoMethod("Flaky"), "ok"); err != nil || got != "ok" {
		t.Fatalf("Flaky = %q, %v", got, err)
	}
	if got := env.flaky.count("Flaky"); got != 3 {
		t.Fatalf("Flaky called %d times, want 3", got)
	}
	// FlakyUnsafe is not declared without side effects: one attempt only.
	_, err := callEcho(ctx, conn, echoMethod("FlakyUnsafe"), "ok")
	wantCode(t, err, codes.Unavailable, "try again")
	if got := env.flaky.count("FlakyUnsafe"); got != 1 {
		t.Fatalf("FlakyUnsafe called %d times, want 1", got)
	}
	// A refusal of the server's own state (rpcerr's SubOwnState) tells the
	// client not to retry it there: one attempt, though Flaky is a read.
	_, err = callEcho(ctx, conn, echoMethod("Flaky"), "own-state")
	wantCode(t, err, codes.Unavailable, "this replica cannot answer")
	if got := env.flaky.count("Flaky"); got != 4 {
		t.Fatalf("Flaky called %d times in all, want 4: one for the own-state refusal", got)
	}
}

func TestRetryServiceConfig(t *testing.T) {
	sc, err := retryServiceConfig([]string{"/curia.consensus.v1.Consensus/Status", "/curia.consensus.v1.Consensus/ListMembers"})
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		MethodConfig []struct {
			Name []struct{ Service, Method string }
		}
	}
	if err := json.Unmarshal([]byte(sc), &parsed); err != nil {
		t.Fatal(err)
	}
	if names := parsed.MethodConfig[0].Name; len(names) != 2 || names[1].Service != "curia.consensus.v1.Consensus" || names[1].Method != "ListMembers" {
		t.Fatalf("names = %+v", names)
	}
	// grpc.NewClient parses the default service config and refuses a bad one.
	for cfg, wantOK := range map[string]bool{sc: true, `{"methodConfig": [{"retryPolicy": {"maxAttempts": "x"}}]}`: false} {
		conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(cfg))
		if (err == nil) != wantOK {
			t.Fatalf("NewClient with %s: %v", cfg, err)
		}
		if err == nil {
			conn.Close()
		}
	}

	for _, bad := range []string{"Status", "/curia.consensus.v1.Consensus", "curia.consensus.v1.Consensus/Status", "/a/b/c"} {
		if _, err := retryServiceConfig([]string{bad}); err == nil {
			t.Errorf("retryServiceConfig accepted %q", bad)
		}
	}
}

// TestReadsAreDeclared: every method of curia's services that reads (its
// name says so) is declared without side effects, so clients retry it;
// no method that writes is, so none is ever retried.
func TestReadsAreDeclared(t *testing.T) {
	declared := map[string]bool{}
	for _, m := range declaredWithoutSideEffects() {
		declared[m] = true
	}
	read := regexp.MustCompile(`/(Get|List|Watch|Status$|Plan$)`)
	var services int
	protoregistry.GlobalFiles.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(f.Package()), "curia.") || f.Package() == "curia.test.v1" {
			return true
		}
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			services++
			for j := range svc.Methods().Len() {
				m := "/" + string(svc.FullName()) + "/" + string(svc.Methods().Get(j).Name())
				if isRead := read.MatchString(m); isRead != declared[m] {
					t.Errorf("%s: reads %v, declared without side effects %v", m, isRead, declared[m])
				}
			}
		}
		return true
	})
	if services < 7 {
		t.Fatalf("%d curia services registered, want every one (the gen imports)", services)
	}
}
