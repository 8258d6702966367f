package curator

import (
	"fmt"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// compileFilter turns a GetNodes filter into a predicate.
func compileFilter(expr string) (func(*curatorv1.Node) (bool, error), error) {
	if expr == "" {
		return func(*curatorv1.Node) (bool, error) { return true, nil }, nil
	}
	return nil, fmt.Errorf("%w: filter expressions are not supported yet", errBadRequest)
}
