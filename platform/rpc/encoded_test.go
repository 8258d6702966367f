package rpc

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sharedReply is one message marshalled once and sent on every Shared
// stream, as the curator's watch hub sends a change to every watcher.
var sharedReply = func() *Encoded {
	e, err := Encode(wrapperspb.String("the same bytes for everyone"))
	if err != nil {
		panic(err)
	}
	return e
}()

// shared sends sharedReply twice, after the request.
func shared(_ any, stream grpc.ServerStream) error {
	if err := stream.RecvMsg(newEchoRequest()); err != nil {
		return err
	}
	for range 2 {
		if err := stream.SendMsg(sharedReply); err != nil {
			return err
		}
	}
	return nil
}

// TestEncodedSharedAcrossStreams: one Encoded sent on many streams, one of
// them gzip-compressed (the client's choice), reaches each client as the
// message it was made from, every time it is sent.
func TestEncodedSharedAcrossStreams(t *testing.T) {
	env := startServer(t, nil)
	conn := env.dial(t, admin)
	for name, opts := range map[string][]grpc.CallOption{
		"plain": nil,
		"gzip":  {grpc.UseCompressor(gzip.Name)},
		"again": nil,
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, echoMethod("Shared"), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := cs.SendMsg(wrapperspb.String("x")); err != nil {
				t.Fatal(err)
			}
			if err := cs.CloseSend(); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				var got wrapperspb.StringValue
				if err := cs.RecvMsg(&got); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if got.GetValue() != "the same bytes for everyone" {
					t.Fatalf("message %d = %q", i, got.GetValue())
				}
			}
		})
	}
}
