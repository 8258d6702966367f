// Package fence checks fences at the resource, in etcd's keyspace (DESIGN §4).
//
// A fence is a short list of conditions {key, create revision} and, for a
// caller acting on a snapshot, the membership epoch it read. A fenced change
// runs only after one etcd transaction has found every condition true; the
// same transaction records the change, so a caller whose lease, term or
// snapshot ended changes nothing. The consensus service uses it for
// membership calls, the curator for role writes.
//
// Conditions are checked as pairs, not one by one: a leader key must be the
// current leader's (no key under the election prefix is older), so a
// follower's candidate key fences nothing; and a lease must have been
// granted by the leader key of the same fence, in its term (the lease
// record says which), so a live lease of one term and the leader key of
// another never add up to a valid fence.
package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
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
func FromProto(p *fencev1.Fence) Fence {
	var f Fence
	for _, c := range p.GetConditions() {
		f.Conditions = append(f.Conditions, Condition{Key: c.GetKey(), CreateRevision: c.GetCreateRevision()})
	}
	f.Epoch = p.GetMembershipEpoch()
	return f
}

// Proto converts to the wire form.
func (f Fence) Proto() *fencev1.Fence {
	p := &fencev1.Fence{MembershipEpoch: f.Epoch}
	for _, c := range f.Conditions {
		p.Conditions = append(p.Conditions, &fencev1.FenceCondition{Key: c.Key, CreateRevision: c.CreateRevision})
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
// key under one of the allowed prefixes with a positive revision, and a
// lease only together with a leader key (the one that granted it). A fence
// on an arbitrary key would let any caller fence itself on a key that never
// goes away.
func (f Fence) Validate(allowedPrefixes ...string) error {
	if len(f.Conditions) == 0 {
		return errors.New("fence: no conditions: a membership change needs the caller's leader key or lease")
	}
	leaders := 0
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
		if strings.HasPrefix(c.Key, keys.LeaderElection) {
			leaders++
		}
	}
	if leaders > 1 {
		return fmt.Errorf("fence: %d leader keys: a fence names the one leader it acts for", leaders)
	}
	if leaders == 0 && f.HasKeyUnder(keys.LeasesPrefix) {
		return fmt.Errorf("fence: a lease needs the leader key that granted it (under %s) in the same fence", keys.LeaderElection)
	}
	if f.Epoch < 0 {
		return fmt.Errorf("fence: membership epoch must not be negative, got %d", f.Epoch)
	}
	return nil
}

// RequireEpoch checks that the fence carries the membership epoch its
// caller planned from: every automated membership change and role write
// acts on a snapshot, so "not checked" (0) is refused.
func (f Fence) RequireEpoch() error {
	if f.Epoch <= 0 {
		return errors.New("fence: membership_epoch is required: the epoch of the member list the change was planned from (ListMembersResponse.membership_epoch)")
	}
	return nil
}

// leader is the fence's leader key condition, if it has one.
func (f Fence) leader() (Condition, bool) {
	for _, c := range f.Conditions {
		if strings.HasPrefix(c.Key, keys.LeaderElection) {
			return c, true
		}
	}
	return Condition{}, false
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
	// Part is what no longer holds, one of the Part constants; callers
	// react differently (PartLease, PartLeader: acquire again; PartEpoch,
	// PartCondition: read again and plan anew).
	Part   string
	Reason string
}

// What a stale fence's StaleError.Part names (rpcerr metadata "part").
const (
	PartLease     = "lease"
	PartLeader    = "leader"
	PartEpoch     = "epoch"
	PartCondition = "condition"
)

func (e *StaleError) Error() string { return "stale fence: " + e.Reason }

// Unwrap makes a StaleError an rpcerr.FenceStale, with its part as metadata.
func (e *StaleError) Unwrap() error { return rpcerr.With(rpcerr.FenceStale, "part", e.Part) }

// ErrStale matches every *StaleError with errors.Is.
var ErrStale = rpcerr.FenceStale

// Apply runs ops in one transaction guarded by f, plus extra comparisons
// (e.g. a node's ModRevision). The guard holds when every condition holds,
// the fence's leader key is the current leader's, every lease in it was
// granted by that leader key in its term (read first, and pinned to the
// revision read), and the epoch, when given, is current. When the guard
// fails it returns a *StaleError naming the first part that no longer
// holds, read in the same transaction, and writes nothing.
func Apply(ctx context.Context, kv clientv3.KV, f Fence, extra []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	leases, err := readLeases(ctx, kv, f)
	if err != nil {
		return nil, err
	}
	var cmps []clientv3.Cmp
	var reads []clientv3.Op
	for _, c := range f.Conditions {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.CreateRevision))
		reads = append(reads, clientv3.OpGet(c.Key, clientv3.WithKeysOnly()))
	}
	if l, ok := f.leader(); ok {
		// No key under the election prefix is older than the fence's: it
		// is the leader's, not a waiting candidate's.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(keys.LeaderElection), ">", l.CreateRevision-1).WithPrefix())
	}
	reads = append(reads, clientv3.OpGet(keys.LeaderElection, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...))
	for _, l := range leases {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(l.key), "=", l.modRev))
	}
	if f.Epoch != 0 && !failpoint.Mutated(failpoint.NoEpochCompare) {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(keys.MembershipEpoch), "=", f.Epoch))
	}
	reads = append(reads, clientv3.OpGet(keys.MembershipEpoch, clientv3.WithKeysOnly()))
	for _, l := range leases {
		reads = append(reads, clientv3.OpGet(l.key, clientv3.WithKeysOnly()))
	}
	cmps = append(cmps, extra...)
	resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Else(reads...).Commit()
	if err != nil {
		return nil, fmt.Errorf("fenced txn: %w", err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	part, reason := staleReason(f, leases, resp)
	return nil, &StaleError{Part: part, Reason: reason}
}

// leaseRead is a lease record of a fence, as read before the transaction.
type leaseRead struct {
	key    string
	modRev int64
}

// readLeases reads the lease records of f's lease conditions and checks
// that each was granted by f's leader key in its term. A lease record that
// changes after this read fails the transaction (its ModRevision is
// pinned).
func readLeases(ctx context.Context, kv clientv3.KV, f Fence) ([]leaseRead, error) {
	var out []leaseRead
	leader, _ := f.leader()
	for _, c := range f.Conditions {
		if !strings.HasPrefix(c.Key, keys.LeasesPrefix) {
			continue
		}
		resp, err := kv.Get(ctx, c.Key)
		if err != nil {
			return nil, fmt.Errorf("read lease %s: %w", c.Key, err)
		}
		if len(resp.Kvs) == 0 {
			return nil, &StaleError{Part: PartLease, Reason: fmt.Sprintf("%s no longer exists (the lease behind it ended); acquire a new one", c.Key)}
		}
		got := resp.Kvs[0]
		if got.CreateRevision != c.CreateRevision {
			return nil, &StaleError{Part: PartLease, Reason: fmt.Sprintf("%s was created at revision %d, not %d (a newer lease holder exists)", c.Key, got.CreateRevision, c.CreateRevision)}
		}
		rec, err := ParseLeaseRecord(got.Value)
		if err != nil {
			return nil, &StaleError{Part: PartLease, Reason: fmt.Sprintf("%s: %v: acquire the lease again", c.Key, err)}
		}
		if (rec.LeaderKey != leader.Key || rec.Term != leader.CreateRevision) && !failpoint.Mutated(failpoint.NoFencePairing) {
			return nil, &StaleError{Part: PartLease, Reason: fmt.Sprintf("%s was granted by leader key %s at term %d, not by the fence's %s: a lease is valid only with the leader term that granted it; acquire it again from the current leader", c.Key, rec.LeaderKey, rec.Term, leader)}
		}
		out = append(out, leaseRead{key: c.Key, modRev: got.ModRevision})
	}
	return out, nil
}

func staleReason(f Fence, leases []leaseRead, resp *clientv3.TxnResponse) (part, reason string) {
	kvsAt := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().GetKvs() }
	for i, c := range f.Conditions {
		kvs := kvsAt(i)
		if len(kvs) == 0 {
			return conditionPart(c.Key), fmt.Sprintf("%s no longer exists (the term or lease behind it ended); acquire a new one", c.Key)
		}
		if got := kvs[0].CreateRevision; got != c.CreateRevision {
			return conditionPart(c.Key), fmt.Sprintf("%s was created at revision %d, not %d (a newer term or lease holder exists)", c.Key, got, c.CreateRevision)
		}
	}
	n := len(f.Conditions)
	if l, ok := f.leader(); ok {
		if first := kvsAt(n); len(first) > 0 && string(first[0].Key) != l.Key {
			return PartLeader, fmt.Sprintf("%s is not the current leader's key (the leader is %s, term %d): a candidate's key fences nothing", l, first[0].Key, first[0].CreateRevision)
		}
	}
	epochKVs := kvsAt(n + 1)
	var epoch int64
	if len(epochKVs) > 0 {
		epoch = epochKVs[0].ModRevision
	}
	if f.Epoch != 0 && epoch != f.Epoch {
		return PartEpoch, fmt.Sprintf("membership epoch is %d, the caller planned at %d: membership changed since; read members again", epoch, f.Epoch)
	}
	for i, l := range leases {
		if kvs := kvsAt(n + 2 + i); len(kvs) == 0 || kvs[0].ModRevision != l.modRev {
			return PartLease, fmt.Sprintf("%s changed during the write (released, expired or granted again); acquire it again", l.key)
		}
	}
	return PartCondition, "a condition of the write no longer holds (the record changed since it was read)"
}

// conditionPart says what a fence condition on key is: a lease's or the
// leader's.
func conditionPart(key string) string {
	if strings.HasPrefix(key, keys.LeasesPrefix) {
		return PartLease
	}
	return PartLeader
}

// BumpEpoch is the operation that moves the membership epoch on. It is in
// the fenced transaction that starts every membership change and in the one
// that finishes it.
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
