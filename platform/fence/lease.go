package fence

import (
	"encoding/json"
	"fmt"
	"time"
)

// LeaseRecord is the value of keys.Lease(name), as JSON: who holds a named
// lease and which curator leader granted it. The curator leader writes it;
// Apply reads it to check that a fence's lease and leader key belong
// together.
type LeaseRecord struct {
	// Holder is who acquired the lease (a reconciler replica's name and its
	// process incarnation).
	Holder string `json:"holder"`
	// Term is the granting leader's term; LeaderKey its election key.
	Term      int64  `json:"term"`
	LeaderKey string `json:"leader_key"`
	// TTLSeconds is the etcd lease's TTL; Granted when it was granted. The
	// live expiry is the etcd lease's (keep-alives do not rewrite the
	// record).
	TTLSeconds int64     `json:"ttl_seconds"`
	Granted    time.Time `json:"granted"`
}

// ParseLeaseRecord decodes a lease record.
func ParseLeaseRecord(b []byte) (LeaseRecord, error) {
	var r LeaseRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("lease record: %w", err)
	}
	if r.LeaderKey == "" || r.Term <= 0 {
		return r, fmt.Errorf("lease record names no granting leader (leader_key %q, term %d)", r.LeaderKey, r.Term)
	}
	return r, nil
}
