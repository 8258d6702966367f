package roleserve

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// backoff doubles the wait between attempts from min up to max, with
// jitter so that the agents of a cluster do not retry in step.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func newBackoff(min, max time.Duration) *backoff {
	if max < min {
		max = min
	}
	return &backoff{min: min, max: max}
}

// next is the wait before the next attempt.
func (b *backoff) next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.min
	case b.cur*2 > b.max:
		b.cur = b.max
	default:
		b.cur *= 2
	}
	// ±20%
	return b.cur + time.Duration((rand.Float64()*0.4-0.2)*float64(b.cur)) //nolint:gosec // G404: jitter, no secret
}

// slowest jumps to the longest wait: for errors that only an operator or
// a later change fixes.
func (b *backoff) slowest() time.Duration {
	b.cur = b.max
	return b.next()
}

func (b *backoff) reset() { b.cur = 0 }

// transient reports whether err is worth retrying soon: the other side is
// unreachable, busy or between leaders.
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Canceled:
		return true
	}
	return false
}

// waitFor waits until ch is closed or ctx ends; it reports whether ch was
// closed.
func waitFor(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-ch:
		return true
	}
}
