// Package rpctest serves an rpc.Server for a test.
package rpctest

import (
	"context"
	"net"
	"testing"

	"curia.dev/platform/rpc"
)

// Serve serves srv on a loopback port until the test ends (a Serve error
// fails the test then) and returns its address.
func Serve(t testing.TB, srv *rpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}
