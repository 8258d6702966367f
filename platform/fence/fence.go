// Package fence checks fences at the resource, in etcd's keyspace (DESIGN §4).
//
// A fence is a short list of conditions {key, create revision} and, for a
// caller acting on a snapshot, the membership epoch it read. A fenced change
// runs only after one etcd transaction has found every condition true; the
// same transaction bumps the epoch and records the change, so a caller whose
// lease, term or snapshot ended changes nothing. The consensus service uses
// it for membership calls, the curator for role writes.
package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/keys"
)

// Condition holds when Key exists and was created at CreateRevision.
type Condition struct {
	Key            string
	CreateRevision int64
}

func (c Condition) String() string { return fmt.Sprintf("%s@%d", c.Key, c.CreateRevision) }

// Fence is a set of conditions that must all hold, plus an optional
// membership epoch (0: not checked).
type Fence struct {
	Conditions []Condition
	Epoch      int64
}

// FromProto converts the wire form. A nil fence has no conditions.
func FromProto(p *consensusv1.Fence) Fence {
	var f Fence
	for _, c := range p.GetConditions() {
		f.Conditions = append(f.Conditions, Condition{Key: c.GetKey(), CreateRevision: c.GetCreateRevision()})
	}
	f.Epoch = p.GetMembershipEpoch()
	return f
}

// Proto converts to the wire form.
func (f Fence) Proto() *consensusv1.Fence {
	p := &consensusv1.Fence{MembershipEpoch: f.Epoch}
	for _, c := range f.Conditions {
		p.Conditions = append(p.Conditions, &consensusv1.FenceCondition{Key: c.Key, CreateRevision: c.CreateRevision})
	}
	return p
}

// WithEpoch returns a copy of f that also requires the membership epoch.
func (f Fence) WithEpoch(epoch int64) Fence {
	f.Conditions = append([]Condition(nil), f.Conditions...)
	f.Epoch = epoch
	return f
}

// Strings renders the conditions as "key@revision", for logs and the audit log.
func (f Fence) Strings() []string {
	out := make([]string, 0, len(f.Conditions)+1)
	for _, c := range f.Conditions {
		out = append(out, c.String())
	}
	if f.Epoch != 0 {
		out = append(out, fmt.Sprintf("%s@mod%d", keys.MembershipEpoch, f.Epoch))
	}
	return out
}

func (f Fence) String() string { return strings.Join(f.Strings(), ",") }

// Validate checks the fence's shape: at least one condition, every one on a
// key under one of the allowed prefixes with a positive revision. A fence on
// an arbitrary key would let any caller fence itself on a key that never
// goes away.
func (f Fence) Validate(allowedPrefixes ...string) error {
	if len(f.Conditions) == 0 {
		return errors.New("fence: no conditions: a membership change needs the caller's leader key or lease")
	}
	for _, c := range f.Conditions {
		if c.CreateRevision <= 0 {
			return fmt.Errorf("fence: condition on %q: create revision must be positive, got %d", c.Key, c.CreateRevision)
		}
		ok := false
		for _, p := range allowedPrefixes {
			if strings.HasPrefix(c.Key, p) && len(c.Key) > len(p) {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("fence: key %q is not a leader or lease key (want a key under %s)", c.Key, strings.Join(allowedPrefixes, " or "))
		}
	}
	if f.Epoch < 0 {
		return fmt.Errorf("fence: membership epoch must not be negative, got %d", f.Epoch)
	}
	return nil
}

// HasKeyUnder reports whether some condition is on a key under prefix.
func (f Fence) HasKeyUnder(prefix string) bool {
	for _, c := range f.Conditions {
		if strings.HasPrefix(c.Key, prefix) {
			return true
		}
	}
	return false
}

// HasKey reports whether some condition is on exactly key.
func (f Fence) HasKey(key string) bool {
	for _, c := range f.Conditions {
		if c.Key == key {
			return true
		}
	}
	return false
}

// StaleError says why a fence no longer holds. Nothing was written.
type StaleError struct {
	Reason string
}

func (e *StaleError) Error() string { return "stale fence: " + e.Reason }

// ErrStale matches every *StaleError with errors.Is.
var ErrStale = errors.New("stale fence")

func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Apply runs ops in one transaction guarded by f, plus extra comparisons
// (e.g. a node's ModRevision). When the guard fails it returns a *StaleError
// naming the first condition that no longer holds, read in the same
// transaction, and writes nothing.
func Apply(ctx context.Context, kv clientv3.KV, f Fence, extra []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	cmps := make([]clientv3.Cmp, 0, len(f.Conditions)+1+len(extra))
	var reads []clientv3.Op
	for _, c := range f.Conditions {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.CreateRevision))
		reads = append(reads, clientv3.OpGet(c.Key, clientv3.WithKeysOnly()))
	}
	if f.Epoch != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(keys.MembershipEpoch), "=", f.Epoch))
	}
	reads = append(reads, clientv3.OpGet(keys.MembershipEpoch, clientv3.WithKeysOnly()))
	cmps = append(cmps, extra...)
	resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Else(reads...).Commit()
	if err != nil {
		return nil, fmt.Errorf("fenced txn: %w", err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	return nil, &StaleError{Reason: staleReason(f, resp)}
}

func staleReason(f Fence, resp *clientv3.TxnResponse) string {
	for i, c := range f.Conditions {
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return fmt.Sprintf("%s no longer exists (the term or lease behind it ended); acquire a new one", c.Key)
		}
		if got := kvs[0].CreateRevision; got != c.CreateRevision {
			return fmt.Sprintf("%s was created at revision %d, not %d (a newer term or lease holder exists)", c.Key, got, c.CreateRevision)
		}
	}
	epochKVs := resp.Responses[len(f.Conditions)].GetResponseRange().GetKvs()
	var epoch int64
	if len(epochKVs) > 0 {
		epoch = epochKVs[0].ModRevision
	}
	if f.Epoch != 0 && epoch != f.Epoch {
		return fmt.Sprintf("membership epoch is %d, the caller planned at %d: membership changed since; read members again", epoch, f.Epoch)
	}
	return "a condition of the write no longer holds (the record changed since it was read)"
}

// BumpEpoch is the operation that moves the membership epoch on. Put it in
// the fenced transaction of every real membership change.
func BumpEpoch(recorder string) clientv3.Op {
	return clientv3.OpPut(keys.MembershipEpoch, recorder)
}

// ReadEpoch returns the current membership epoch (0 if never bumped).
func ReadEpoch(ctx context.Context, kv clientv3.KV) (int64, error) {
	resp, err := kv.Get(ctx, keys.MembershipEpoch, clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("read membership epoch: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

// EpochAfter returns the epoch that a successful Apply with BumpEpoch left
// behind: the transaction's revision.
func EpochAfter(resp *clientv3.TxnResponse) int64 { return resp.Header.Revision }
