package rpc

import (
	"context"
	"net"
	"testing"
	"time"

	"curia.dev/platform/pki"
)

// TestDialAnyFailsOver: a connection to several replicas keeps working when
// the one it used stops.
func TestDialAnyFailsOver(t *testing.T) {
	first := startServer(t, nil)
	// A second replica of the same cluster.
	srv, err := NewServer(ServerConfig{Credentials: first.ca.creds(t, curator), Policy: testPolicy()})
	if err != nil {
		t.Fatal(err)
	}
	srv.GRPC().RegisterService(echoServiceDesc(first.flaky), nil)
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

	conn, err := DialAny([]string{first.addr, lis.Addr().String()}, ClientConfig{Credentials: first.ca.creds(t, admin), ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if _, err := callEcho(cctx, conn, echoMethod("Echo"), "one"); err != nil {
		t.Fatal(err)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := callEcho(cctx, conn, echoMethod("Echo"), "two")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover to the second replica: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // poll
	}
}
