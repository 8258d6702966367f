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
	// NoQuorumGuard: consensus removes a voter without checking that the
	// voters left keep a healthy quorum. Caught by consensus
	// TestRemoveGuards.
	NoQuorumGuard = "no-quorum-guard"
	// NoEpochCompare: fenced transactions ignore the membership epoch the
	// caller planned at (the check before them still runs, so the epoch
	// must move in between). Caught by consensus
	// TestLeadershipMovesAfterCommit.
	NoEpochCompare = "no-epoch-compare"
	// NoFinishEpochBump: finishing a membership change does not move the
	// epoch, so a snapshot taken while it was in flight stays valid.
	// Caught by consensus TestOneChangeAtATime.
	NoFinishEpochBump = "no-finish-epoch-bump"
	// NoFencePairing: a lease counts with any leader key, not only the
	// term that granted it. Caught by consensus TestFencePairing.
	NoFencePairing = "no-fence-pairing"
	// NoCRLCheck: no certificate is revoked (crl.Watcher.IsRevoked): the
	// APIs and etcd's client and peer ports take revoked certificates.
	// Caught by consensus TestEtcdRefusesRevoked.
	NoCRLCheck = "no-crl-check"
	// NoTombstones: a deleted node's id may register again. Caught by
	// curator TestLifecycle.
	NoTombstones = "no-tombstones"
	// CRLNumberFromEtcd: the curator numbers a new CRL from the one
	// stored in etcd alone, not past the newest it holds (after a restore
	// every process refuses it as older). Caught by
	// services/curator TestCRLAfterRestore.
	CRLNumberFromEtcd = "crl-number-from-etcd"
	// NoCRLUnion: a new CRL lists the stored list's revocations only, not
	// those of the newest list the curator holds (a restore loses them).
	// Caught by services/curator TestCRLAfterRestore.
	NoCRLUnion = "no-crl-union"
	// NoOldMemberCRLWait: a member kept on disk restarts at once with the
	// list it kept, without waiting for the curators'. Caught by consensus
	// TestRecoveryFencesOldMembers.
	NoOldMemberCRLWait = "no-old-member-crl-wait"
	// NoClusterPin: an etcd client's pin (platform/etcdpin) accepts the
	// answers of any cluster. Caught by etcdpin
	// TestPinRefusesAnotherCluster.
	NoClusterPin = "no-cluster-pin"
	// NoPeerCut: the consensus peer gate keeps the established
	// connections of a certificate revoked after they were opened.
	// Caught by consensus TestPeerConnectionCutOnRevocation.
	NoPeerCut = "no-peer-cut"
	// NoTermGuard: the curator leader's writes (leadership.Txn) do not
	// compare its leader key's create revision with its term, so a
	// replica whose term ended before it noticed still writes. Caught by
	// curator TestTxnRefusedAfterTermLost.
	NoTermGuard = "no-term-guard"
)
