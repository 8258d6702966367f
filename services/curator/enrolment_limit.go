package curator

import (
	"context"
	"fmt"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"

	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// enrolmentLimit bounds the calls of enrolling nodes on this replica.
// Anyone with a key can speak as an enrolling node (a self-signed
// certificate), and its calls cost CA signatures and etcd writes; admin,
// node and service identities are not limited. A forwarded call counts at
// the follower and again at the leader, so the leader's bucket bounds the
// cluster.
type enrolmentLimit struct {
	limiter *rate.Limiter
}

func newEnrolmentLimit(perSecond float64, burst int) *enrolmentLimit {
	return &enrolmentLimit{limiter: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

func (e *enrolmentLimit) check(ctx context.Context) error {
	if rpc.Caller(ctx).Kind != pki.KindEnrolling || e.limiter.Allow() {
		return nil
	}
	return fmt.Errorf("%w: enrolling nodes are limited to %g calls per second on this curator (burst %d); retry in a second", errExhausted, float64(e.limiter.Limit()), e.limiter.Burst())
}

func (e *enrolmentLimit) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if err := e.check(ctx); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

func (e *enrolmentLimit) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	if err := e.check(ss.Context()); err != nil {
		return err
	}
	return next(srv, ss)
}
