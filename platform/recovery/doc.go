// Package recovery rebuilds a curia cluster that lost the majority of its
// etcd voters for good, from the most up-to-date survivor or from a
// snapshot file, through the consensus processes' Recover and
// RestoreSnapshot calls. It knows nothing of how the cluster is laid out:
// its caller names the consensus processes (addresses), the curators and
// the admin credentials. curia-local recover (deploy/local) and curiactl
// recover / snapshot restore (platform/cmd/curiactl) both run it, so that
// there is one recovery.
//
//	survey ──▶ awaitLoss ──▶ choose ──▶ consent? ──▶ Recover / RestoreSnapshot ──▶ wait for regrowth ──▶ Report
//	(Status of    (no quorum    (highest     (--confirm    (on the chosen node)          (curators: voters =
//	 every node)   for Settle)   raft index)   names it)                                  control_plane_size)
//
// It refuses, changing nothing, when a quorum is reachable (a partition or
// a slow election is no loss: recovering would fork the cluster), when no
// survivor holds data (restore a snapshot instead), and, before anything
// is surveyed, when the snapshot file fails its checks (ResolveSnapshot).
//
// Files:
//
//	doc.go       this overview
//	recover.go   Recover: the flow above, its Cluster, Options and Report
//	survey.go    the survey of the consensus processes, the wait for a loss, the choice of the survivor
//	snapshot.go  ResolveSnapshot (a snapshot argument to a verified local file) and the RestoreSnapshot stream
//	regrow.go    the wait for the control plane to grow back, and what the recovery may have lost
package recovery
