package curator

import (
	"context"

	"curia.dev/platform/rpcerr"
)

// toStatus is what the server's error interceptor makes of a handler's
// error, for tests that call handlers directly.
func toStatus(err error) error { return rpcerr.ToStatus(context.Background(), nil, "test", err) }
