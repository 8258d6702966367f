package curator

import "curia.dev/platform/rpcerr"

// Refusals, as the kinds of platform/rpcerr (which hold the one code table)
// or refinements of them: handlers wrap them with the facts, and the
// server's error interceptor turns them into statuses.
var (
	errNotLeader   = rpcerr.NotLeader
	errConflict    = rpcerr.Conflict
	errBadRequest  = rpcerr.Invalid
	errNotFound    = rpcerr.NotFound
	errRefused     = rpcerr.Refused
	errDenied      = rpcerr.Denied
	errUnavailable = rpcerr.Unavailable
	// errExhausted: a rate limit; retry later.
	errExhausted = rpcerr.Exhausted
)
