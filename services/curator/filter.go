package curator

import (
	"container/list"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"google.golang.org/protobuf/reflect/protoreflect"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// GetNodes filters are CEL expressions (github.com/google/cel-go) over
//
//	node   curia.curator.v1.Node, with health and last_heartbeat filled in
//	now    the time of the call (a timestamp)
//
// in the container curia.curator.v1, so enum values read
// NodeState.NODE_STATE_UP or, as the API's own example has it, plain
// NODE_STATE_UP. For example:
//
//	node.state == NodeState.NODE_STATE_UP && has(node.roles.consensus_member)
//	node.health != NodeHealth.NODE_HEALTH_HEALTHY
//	node.labels["zone"] == "a" && node.id.startsWith("node-")
//	node.last_heartbeat < now - duration("5m")
//
// The expression must be boolean; that is checked when it compiles. A
// filter that cannot be decided for a node because it reads a map key the
// node lacks (node.labels["zone"] of a node without that label) does not
// match that node, as a comparison with NULL does not in SQL; every other
// evaluation error fails the call and names the node.
//
// A hostile filter cannot burn CPU: the source is at most filterMaxLen
// characters (GetNodesRequest's contract, and CEL's parser limit) and every evaluation stops at filterCostLimit (CEL's cost
// units, about one per operation and per element a comprehension visits).
// Compiled programs are kept in a small LRU: operators repeat their filters.

const (
	filterMaxLen    = 4096
	filterCostLimit = 100_000
	filterCacheSize = 256
)

// filterEnv is the CEL environment of filters, made once.
var filterEnv = sync.OnceValues(func() (*cel.Env, error) {
	opts := []cel.EnvOption{
		cel.Container("curia.curator.v1"),
		cel.Types(&curatorv1.Node{}),
		cel.Variable("node", cel.ObjectType("curia.curator.v1.Node")),
		cel.Variable("now", cel.TimestampType),
		cel.ParserExpressionSizeLimit(filterMaxLen),
	}
	// Plain enum value names (NODE_STATE_UP), as constants: CEL itself knows
	// only the names qualified by their enum (NodeState.NODE_STATE_UP).
	for _, e := range []protoreflect.EnumDescriptor{
		curatorv1.NodeState(0).Descriptor(),
		curatorv1.NodeHealth(0).Descriptor(),
	} {
		for i := 0; i < e.Values().Len(); i++ {
			v := e.Values().Get(i)
			opts = append(opts, cel.Constant(string(v.Name()), cel.IntType, types.Int(v.Number())))
		}
	}
	return cel.NewEnv(opts...)
})

// compileFilter turns a GetNodes filter into a predicate. Errors in the
// expression are errBadRequest with CEL's message.
func compileFilter(expr string) (func(*curatorv1.Node) (bool, error), error) {
	if strings.TrimSpace(expr) == "" {
		return func(*curatorv1.Node) (bool, error) { return true, nil }, nil
	}
	prg, err := filterPrograms.get(expr)
	if err != nil {
		return nil, err
	}
	now := types.Timestamp{Time: time.Now()}
	return func(n *curatorv1.Node) (bool, error) {
		out, _, err := prg.Eval(map[string]any{"node": n, "now": now})
		if err != nil {
			if strings.HasPrefix(err.Error(), "no such key") {
				return false, nil
			}
			return false, fmt.Errorf("%w: filter on node %s: %v", errBadRequest, n.GetId(), err)
		}
		match, ok := out.Value().(bool)
		if !ok { // the compiler checked the type; this is a bug
			return false, fmt.Errorf("filter on node %s gave %v, not a boolean", n.GetId(), out.Type())
		}
		return match, nil
	}, nil
}

// compileProgram compiles, checks and plans one filter.
func compileProgram(expr string) (cel.Program, error) {
	env, err := filterEnv()
	if err != nil {
		return nil, fmt.Errorf("filter environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("%w: filter: %v", errBadRequest, iss.Err())
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("%w: filter must be a boolean expression, but it is of type %s (compare it, e.g. with ==)", errBadRequest, t)
	}
	prg, err := env.Program(ast, cel.CostLimit(filterCostLimit))
	if err != nil {
		return nil, fmt.Errorf("%w: filter: %v", errBadRequest, err)
	}
	return prg, nil
}

// programCache is a small LRU of compiled filters. cel.Program is safe for
// concurrent use; failed compilations are not kept.
type programCache struct {
	mu      sync.Mutex
	order   *list.List // of *programEntry, most recently used first
	byExpr  map[string]*list.Element
	maxSize int
}

type programEntry struct {
	expr string
	prg  cel.Program
}

var filterPrograms = &programCache{order: list.New(), byExpr: map[string]*list.Element{}, maxSize: filterCacheSize}

func (c *programCache) get(expr string) (cel.Program, error) {
	c.mu.Lock()
	if e, ok := c.byExpr[expr]; ok {
		c.order.MoveToFront(e)
		prg := e.Value.(*programEntry).prg
		c.mu.Unlock()
		return prg, nil
	}
	c.mu.Unlock()

	prg, err := compileProgram(expr) // outside the lock: compiling takes a while
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byExpr[expr]; ok { // compiled meanwhile by another call
		c.order.MoveToFront(e)
		return e.Value.(*programEntry).prg, nil
	}
	c.byExpr[expr] = c.order.PushFront(&programEntry{expr: expr, prg: prg})
	for c.order.Len() > c.maxSize {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.byExpr, oldest.Value.(*programEntry).expr)
	}
	return prg, nil
}
