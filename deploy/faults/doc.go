// Package faults is curia's fault suite (make test-faults): a whole cluster
// of real processes, each host in its own network namespace, under a
// recorded workload through the public APIs, while nemeses kill, pause and
// partition processes and tamper with membership; a checker samples the
// cluster's invariants continuously and checks the recorded history at the
// end. It needs root (network namespaces, iptables).
package faults
