// Package backoff is curia's one retry wait: doubling from a minimum to a
// maximum, with jitter so that the agents of a cluster do not retry in step,
// and the delay a server asks for (google.rpc.RetryInfo) when it asks.
package backoff

import (
	"math/rand/v2"
	"time"

	"curia.dev/platform/rpcerr"
)

// Backoff is the wait between attempts. Not safe for concurrent use.
type Backoff struct {
	min, max time.Duration
	cur      time.Duration
}

// New returns a backoff from min up to max.
func New(min, max time.Duration) *Backoff {
	if max < min {
		max = min
	}
	return &Backoff{min: min, max: max}
}

// Next is the wait before the next attempt: min, then doubling up to max,
// each ±20%.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.min
	case b.cur*2 > b.max:
		b.cur = b.max
	default:
		b.cur *= 2
	}
	return b.cur + time.Duration((rand.Float64()*0.4-0.2)*float64(b.cur)) //nolint:gosec // G404: jitter, no secret
}

// After is the wait after err: the delay the server asked for (RetryInfo:
// etcd's reconfiguration window, a learner catching up, a rate limit, a
// lease's expiry) within [min, max]; otherwise Next.
func (b *Backoff) After(err error) time.Duration {
	if d, ok := rpcerr.RetryDelay(err); ok {
		return min(max(d, b.min), b.max)
	}
	return b.Next()
}

// Slowest jumps to the longest wait: for errors that only an operator or a
// later change fixes.
func (b *Backoff) Slowest() time.Duration {
	b.cur = b.max
	return b.Next()
}

// Reset starts over from min (after a success).
func (b *Backoff) Reset() { b.cur = 0 }
