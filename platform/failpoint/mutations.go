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
	// NoRecorderDeadline: the recorder of a membership change counts its
	// call's deadline from the commit's answer, not from before it was
	// sent, and does not check its record is still pending before the
	// call. Caught by consensus TestPausedChangeResolvedNeverApplied/committed.
	NoRecorderDeadline = "no-recorder-deadline"
	// AnyLeaderHealthy: the quorum guard counts a voter that answers and
	// names any leader, of any term, as healthy. Caught by consensus
	// TestQuorumGuardJudgesTheCurrentTerm.
	AnyLeaderHealthy = "any-leader-healthy"
	// NoUnstartedCheck: consensus ignores RemoveMemberRequest.unstarted_only
	// and removes a learner that started after the planner saw it
	// unstarted. Caught by consensus TestUnstartedOnlyKeepsAStartedLearner.
	NoUnstartedCheck = "no-unstarted-check"
)
