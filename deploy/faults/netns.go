package faults

// The network: every host (node, curator, reconciler) in its own network
// namespace with one interface, all of them on a bridge in a namespace of
// its own (the switch), which the suite itself reaches through an uplink
// from the root namespace. A partition is a pair of iptables DROP rules in
// the namespaces of the two hosts, so packets between them are lost, as
// on a real network, while every other path still works. Nothing of it
// touches the root namespace's firewall; Close deletes every namespace.

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
)

// Net is the network of namespaces.
type Net struct {
	name   string
	subnet string
	// hosts maps a host name to its IP in the subnet.
	hosts map[string]string

	mu  sync.Mutex
	cut map[[2]string]bool // partitioned host pairs, sorted
}

// NewNet builds the network: name prefixes the namespaces (at most 10
// characters), subnet is a /24's first three octets (the suite takes .1),
// hosts maps host names to their IPs in it. Leftovers of an earlier run
// under the same name are removed first.
func NewNet(name, subnet string, hosts map[string]string) (*Net, error) {
	if len(name) > 10 {
		return nil, fmt.Errorf("network name %q: at most 10 characters", name)
	}
	n := &Net{name: name, subnet: subnet, hosts: hosts, cut: map[[2]string]bool{}}
	n.Close()
	sw := n.ns("switch")
	steps := [][]string{
		{"netns", "add", sw},
		{"-n", sw, "link", "add", "br0", "type", "bridge"},
		{"-n", sw, "link", "set", "dev", "br0", "up"},
		{"link", "add", n.uplink(), "type", "veth", "peer", "name", "uplink", "netns", sw},
		{"-n", sw, "link", "set", "dev", "uplink", "master", "br0", "up"},
		{"addr", "add", subnet + ".1/24", "dev", n.uplink()},
		{"link", "set", "dev", n.uplink(), "up"},
	}
	for i, h := range n.hostNames() {
		ns, port := n.ns(h), fmt.Sprintf("p%d", i)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"link", "add", port, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"-n", sw, "link", "set", "dev", port, "master", "br0", "up"},
			[]string{"-n", ns, "addr", "add", hosts[h] + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "dev", "eth0", "up"},
			[]string{"-n", ns, "link", "set", "dev", "lo", "up"},
		)
	}
	for _, s := range steps {
		if err := command("ip", s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

func (n *Net) ns(host string) string { return n.name + "-" + host }
func (n *Net) uplink() string        { return n.name + "-up" }

func (n *Net) hostNames() []string {
	var out []string
	for h := range n.hosts {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// Exec is the command-line prefix that runs a program on host.
func (n *Net) Exec(host string) []string { return []string{"ip", "netns", "exec", n.ns(host)} }

// Partition cuts a and b off from each other, both ways.
func (n *Net) Partition(a, b string) error {
	if a == b {
		return nil
	}
	pair := [2]string{min(a, b), max(a, b)}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[pair] {
		return nil
	}
	for _, side := range [][2]string{{a, b}, {b, a}} {
		peer := n.hosts[side[1]]
		for _, rule := range [][]string{{"INPUT", "-s", peer}, {"OUTPUT", "-d", peer}} {
			if err := n.iptables(side[0], append([]string{"-A"}, append(rule, "-j", "DROP")...)...); err != nil {
				return err
			}
		}
	}
	n.cut[pair] = true
	return nil
}

// Isolate cuts host off from every other host (the suite still reaches it,
// as an operator's terminal would).
func (n *Net) Isolate(host string) error {
	for _, h := range n.hostNames() {
		if err := n.Partition(host, h); err != nil {
			return err
		}
	}
	return nil
}

// Cut lists the partitioned pairs, as "a|b".
func (n *Net) Cut() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for p := range n.cut {
		out = append(out, p[0]+"|"+p[1])
	}
	slices.Sort(out)
	return out
}

// HealAll mends every partition.
func (n *Net) HealAll() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []string
	for _, h := range n.hostNames() {
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			if err := n.iptables(h, "-F", chain); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	clear(n.cut)
	if len(errs) > 0 {
		return fmt.Errorf("heal: %s", strings.Join(errs, "; "))
	}
	return nil
}

func (n *Net) iptables(host string, args ...string) error {
	return command("ip", append([]string{"netns", "exec", n.ns(host), "iptables", "-w"}, args...)...)
}

// Close deletes the namespaces (and with them every link; the uplink goes
// with its peer).
func (n *Net) Close() {
	for _, h := range n.hostNames() {
		_ = exec.Command("ip", "netns", "del", n.ns(h)).Run()
	}
	// Best effort: what is gone already (a half-made net) fails, fine.
	_ = exec.Command("ip", "netns", "del", n.ns("switch")).Run()
	_ = exec.Command("ip", "link", "del", n.uplink()).Run()
}

// command runs a tool and returns its output in the error when it fails.
func command(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
