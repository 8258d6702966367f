package failpoint

// The mechanisms Mutated can switch off.
const (
	// NoPending: membership changes write no cluster-wide pending record
	// (so no caller sees one) and commit without checking for one.
	NoPending = "no-pending"
	// NoSnapshotFreshness: the reconciler plans from any node snapshot
	// (no min_revision), and the watch hub leaves unreadable records out.
	NoSnapshotFreshness = "no-snapshot-freshness"
	// NoAbsenceProof: the reconciler removes members "for want of a node"
	// without the proof of absence.
	NoAbsenceProof = "no-absence-proof"
	// NoIncarnation: a reconciler asks for the lease under its bare name.
	NoIncarnation = "no-incarnation"
	// NoDefragOrder: the curator leader defragments etcd's members in id
	// order, the etcd leader among them, without moving its leadership.
	NoDefragOrder = "no-defrag-order"
	// CRLNumberFromEtcd: the curator numbers a new CRL from the one
	// stored in etcd alone, not past the newest it holds (after a restore
	// every process refuses it as older). Caught by
	// services/curator TestCRLAfterRestore.
	CRLNumberFromEtcd = "crl-number-from-etcd"
	// NoCRLUnion: a new CRL lists the stored list's revocations only, not
	// those of the newest list the curator holds (a restore loses them).
	// Caught by services/curator TestCRLAfterRestore.
	NoCRLUnion = "no-crl-union"
)
