package consensus

import (
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"curia.dev/platform/rpcerr"
)

// Refusals this service decides itself, as refinements of the kinds in
// platform/rpcerr (which hold the one code table): handlers wrap them with
// the facts (which member, which node), and the server's error interceptor
// turns them into statuses.
var (
	errNotRunning    = rpcerr.Unavailable.SubOwnState("the local etcd member is not running")
	errBadRequest    = rpcerr.Invalid
	errRefused       = rpcerr.Refused
	errStillMember   = rpcerr.Refused.Sub("this node is still an etcd member")
	errCannotConfirm = rpcerr.Unavailable.Sub("cannot confirm membership")
	errNotFound      = rpcerr.NotFound
	// errPeerURLTaken: another member has the peer URL.
	errPeerURLTaken = rpcerr.Exists.Sub("peer URL in use")
	// errLearnerPending: etcd allows one learner at a time, and a learner
	// is promoted only once it runs and has caught up.
	errLearnerPending = rpcerr.LearnerPending
	// errQuorumAtRisk: the change would leave fewer healthy voters than a
	// quorum.
	errQuorumAtRisk = rpcerr.QuorumAtRisk
	// errChangePending: another membership change is in flight somewhere
	// in the cluster; retry once it finished.
	errChangePending = rpcerr.ChangePending
	// errOutcomeUnknown: the member call of a change failed in a way that
	// does not say whether etcd applied it; the change stays pending.
	errOutcomeUnknown = rpcerr.Unavailable.Sub("outcome of the membership change unknown")
	// errTryAgain: etcd refused for a reason that passes by itself.
	errTryAgain = rpcerr.Unavailable.Sub("try again shortly")
)

// explain adds the operator's next step to etcd's terse membership errors
// (rpcerr maps them to LEARNER_PENDING, QUORUM_AT_RISK, ... with a retry
// delay where they pass by themselves).
func explain(err error, what string) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyLearners):
		return fmt.Errorf("%s: another learner is still joining (etcd allows one learner at a time): promote or remove it first: %w", what, err)
	case errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
		return fmt.Errorf("%s: the learner has not caught up with the leader yet: retry once it has: %w", what, err)
	case errors.Is(err, rpctypes.ErrUnhealthy):
		return fmt.Errorf("%s: etcd refuses for now: a quorum of voters has not been connected long enough (etcd wants 5s of contact after a membership change or restart) or the change would break quorum; retry shortly: %w", what, err)
	case errors.Is(err, rpctypes.ErrPeerURLExist):
		return fmt.Errorf("%s: another member already uses this peer URL: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
