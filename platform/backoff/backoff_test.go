package backoff_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"curia.dev/platform/backoff"
	"curia.dev/platform/rpcerr"
)

func within(d, want time.Duration) bool {
	return d >= want*8/10 && d <= want*12/10
}

func TestDoublesToTheMaximumWithJitter(t *testing.T) {
	b := backoff.New(100*time.Millisecond, time.Second)
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if d := b.Next(); !within(d, want*time.Millisecond) {
			t.Fatalf("attempt %d: waited %v, want %v ±20%%", i, d, want*time.Millisecond)
		}
	}
	b.Reset()
	if d := b.Next(); !within(d, 100*time.Millisecond) {
		t.Fatalf("after Reset: %v, want 100ms ±20%%", d)
	}
	if d := b.Slowest(); !within(d, time.Second) {
		t.Fatalf("Slowest: %v, want 1s ±20%%", d)
	}
}

func TestAfterHonoursRetryInfo(t *testing.T) {
	b := backoff.New(100*time.Millisecond, 10*time.Second)
	wire := func(err error) error {
		st, _ := status.FromError(rpcerr.ToStatus(t.Context(), nil, "test", err))
		return status.FromProto(st.Proto()).Err()
	}
	asked := wire(rpcerr.RetryAfter(fmt.Errorf("%w: window", rpcerr.Unavailable), 3*time.Second))
	if d := b.After(asked); d != 3*time.Second {
		t.Fatalf("After(RetryInfo 3s) = %v", d)
	}
	// Bounded: a server cannot park a caller beyond max, nor make it spin.
	if d := b.After(wire(rpcerr.RetryAfter(rpcerr.Unavailable, time.Hour))); d != 10*time.Second {
		t.Fatalf("After(RetryInfo 1h) = %v, want the max 10s", d)
	}
	if d := b.After(wire(rpcerr.RetryAfter(rpcerr.Unavailable, time.Microsecond))); d != 100*time.Millisecond {
		t.Fatalf("After(RetryInfo 1µs) = %v, want the min 100ms", d)
	}
	b.Reset()
	if d := b.After(wire(rpcerr.Unavailable)); !within(d, 100*time.Millisecond) {
		t.Fatalf("After(no RetryInfo) = %v, want the next step", d)
	}
}
