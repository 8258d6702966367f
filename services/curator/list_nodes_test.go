package curator_test

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	cut "curia.dev/services/curator/curatortest"
)

// listPages walks every page of a listing and returns the pages' ids, in
// order; between returns the page before each call but the first.
func listPages(t *testing.T, m curatorv1.ManagementClient, req *curatorv1.ListNodesRequest, between func(page int, last string)) [][]string {
	t.Helper()
	ctx := ctxT(t)
	req = proto.CloneOf(req)
	var pages [][]string
	for {
		resp, err := m.ListNodes(ctx, req)
		if err != nil {
			t.Fatalf("page %d: %v", len(pages), err)
		}
		var ids []string
		for _, n := range resp.Nodes {
			ids = append(ids, n.Id)
		}
		pages = append(pages, ids)
		if resp.NextPageToken == "" {
			return pages
		}
		if len(resp.Nodes) != int(req.PageSize) {
			t.Fatalf("page %d has %d nodes and a next page, want %d", len(pages)-1, len(resp.Nodes), req.PageSize)
		}
		if between != nil {
			between(len(pages), ids[len(ids)-1])
		}
		req.PageToken = resp.NextPageToken
	}
}

// TestListNodesPagination: a walk through every page lists every node
// that exists throughout it exactly once, in id order, while nodes are
// created between pages and the last node of a page is deleted before the
// next: the token is the last id, not an offset.
func TestListNodesPagination(t *testing.T) {
	c := cut.New(t, 1)
	cli := c.Etcd(c.Voters[0].ClientURL)
	initial := append(cut.SeedNodes(t, cli, 40), c.Voters[0].ID)
	m := c.Management()
	ctx := ctxT(t)

	deleted := map[string]bool{}
	var added []string
	pages := listPages(t, m, &curatorv1.ListNodesRequest{PageSize: 7}, func(page int, last string) {
		added = append(added, cut.SeedNodes(t, cli, 3)...)
		if page == 2 { // the token's own node goes
			if _, err := cli.Delete(ctx, keys.Node(last)); err != nil {
				t.Fatal(err)
			}
			deleted[last] = true
		}
	})
	if len(pages) < 6 {
		t.Fatalf("%d pages of 7 for 41 nodes and more", len(pages))
	}
	seen := map[string]int{}
	var all []string
	for _, p := range pages {
		for _, id := range p {
			seen[id]++
			all = append(all, id)
		}
	}
	if !slices.IsSorted(all) {
		t.Fatalf("the pages are not in id order: %v", all)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("node %s listed %d times", id, n)
		}
	}
	for _, id := range initial {
		if seen[id] != 1 {
			t.Errorf("node %s existed throughout the walk but is listed %d times", id, seen[id])
		}
	}
	t.Logf("%d pages, %d nodes listed, %d of %d nodes created during the walk among them", len(pages), len(all), len(all)-len(initial), len(added))

	// Now: every node in one default page (500 nodes); with a filter only
	// the matching ones (the seeded nodes are in zone a, the bootstrap
	// node is not).
	now := len(initial) - len(deleted) + len(added)
	resp, err := m.ListNodes(ctx, &curatorv1.ListNodesRequest{})
	if err != nil || len(resp.Nodes) != now || resp.NextPageToken != "" {
		t.Fatalf("default page: %d nodes, token %q, %v; want %d nodes, no token", len(resp.GetNodes()), resp.GetNextPageToken(), err, now)
	}
	zoneA := listPages(t, m, &curatorv1.ListNodesRequest{Filter: `node.labels["zone"] == "a"`, PageSize: 10}, nil)
	if got := len(slices.Concat(zoneA...)); got != now-1 {
		t.Fatalf("zone a: %d nodes in %d pages, want %d", got, len(zoneA), now-1)
	}
}

// TestListNodesViews: BASIC leaves out the certificate and CRL bytes and
// FULL has them, in ListNodes (default BASIC) and GetNodes (default FULL,
// as before views); the filter sees the whole node either way.
func TestListNodesViews(t *testing.T) {
	c := cut.New(t, 1)
	m := c.Management()
	ctx := ctxT(t)
	member := `has(node.roles.consensus_member) && size(node.roles.consensus_member.member_certificate) > 0`
	list := func(view curatorv1.NodeView) *curatorv1.Node {
		t.Helper()
		resp, err := m.ListNodes(ctx, &curatorv1.ListNodesRequest{Filter: member, View: view})
		if err != nil || len(resp.Nodes) != 1 {
			t.Fatalf("ListNodes %v: %v, %v", view, resp, err)
		}
		return resp.Nodes[0]
	}
	stream := func(view curatorv1.NodeView) *curatorv1.Node {
		t.Helper()
		s, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{Filter: member, View: view})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil || len(resp.Nodes) != 1 {
			t.Fatalf("GetNodes %v: %v, %v", view, resp, err)
		}
		return resp.Nodes[0]
	}
	hasBytes := func(n *curatorv1.Node) bool {
		cm := n.GetRoles().GetConsensusMember()
		return len(cm.GetMemberCertificate()) > 0 && len(cm.GetJoin().GetCaCertificate()) > 0
	}
	noBytes := func(n *curatorv1.Node) bool {
		cm := n.GetRoles().GetConsensusMember()
		return cm != nil && len(cm.GetMemberCertificate()) == 0 && len(cm.GetJoin().GetCaCertificate()) == 0 && len(cm.GetJoin().GetCrl()) == 0
	}
	for name, tc := range map[string]struct {
		node func() *curatorv1.Node
		full bool
	}{
		"ListNodes default": {func() *curatorv1.Node { return list(curatorv1.NodeView_NODE_VIEW_UNSPECIFIED) }, false},
		"ListNodes BASIC":   {func() *curatorv1.Node { return list(curatorv1.NodeView_NODE_VIEW_BASIC) }, false},
		"ListNodes FULL":    {func() *curatorv1.Node { return list(curatorv1.NodeView_NODE_VIEW_FULL) }, true},
		"GetNodes default":  {func() *curatorv1.Node { return stream(curatorv1.NodeView_NODE_VIEW_UNSPECIFIED) }, true},
		"GetNodes BASIC":    {func() *curatorv1.Node { return stream(curatorv1.NodeView_NODE_VIEW_BASIC) }, false},
		"GetNodes FULL":     {func() *curatorv1.Node { return stream(curatorv1.NodeView_NODE_VIEW_FULL) }, true},
	} {
		t.Run(name, func(t *testing.T) {
			n := tc.node()
			if tc.full && !hasBytes(n) || !tc.full && !noBytes(n) {
				t.Fatalf("full=%v, node %s: %v", tc.full, n.Id, n.Roles)
			}
			// Everything else is there.
			if n.Id != c.Voters[0].ID || n.State != curatorv1.NodeState_NODE_STATE_UP || n.Status.GetAddress() == "" ||
				n.Health == curatorv1.NodeHealth_NODE_HEALTH_UNSPECIFIED || n.CertificateSerial == "" || n.Roles.GetConsensusMember().GetJoin().GetMemberId() == 0 {
				t.Fatalf("node without its basic fields: %v", n)
			}
		})
	}
	// BASIC is FULL without the bytes, every other field the same, and
	// it cleared copies: the replica's own view still has the bytes.
	basic, full := list(curatorv1.NodeView_NODE_VIEW_BASIC), list(curatorv1.NodeView_NODE_VIEW_FULL)
	if !hasBytes(full) {
		t.Fatal("a BASIC listing cleared the replica's view of the node")
	}
	full.Roles.ConsensusMember.MemberCertificate = nil
	full.Roles.ConsensusMember.Join.CaCertificate, full.Roles.ConsensusMember.Join.Crl = nil, nil
	if !proto.Equal(basic, full) {
		t.Fatalf("BASIC differs from FULL in more than the bytes:\nBASIC %v\nFULL  %v", basic, full)
	}
}

// TestListNodesRefusals: requests outside the contract, tokens that are
// not ListNodes', or not of this listing, are InvalidArgument with a
// reason; only admins list.
func TestListNodesRefusals(t *testing.T) {
	c := cut.New(t, 1)
	cut.SeedNodes(t, c.Etcd(c.Voters[0].ClientURL), 3)
	m := c.Management()
	ctx := ctxT(t)
	first, err := m.ListNodes(ctx, &curatorv1.ListNodesRequest{PageSize: 2, Filter: "true"})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	for name, tc := range map[string]struct {
		req      *curatorv1.ListNodesRequest
		contains string
	}{
		"page_size above 1000": {&curatorv1.ListNodesRequest{PageSize: 1001}, "page_size"},
		"negative page_size":   {&curatorv1.ListNodesRequest{PageSize: -1}, "page_size"},
		"undefined view":       {&curatorv1.ListNodesRequest{View: 7}, "view"},
		"token not base64":     {&curatorv1.ListNodesRequest{PageToken: "not a token!"}, "page_token is not a next_page_token that ListNodes returned"},
		"token too short":      {&curatorv1.ListNodesRequest{PageToken: "AQ"}, "page_token is not a next_page_token that ListNodes returned"},
		"token too long":       {&curatorv1.ListNodesRequest{PageToken: string(make([]byte, 1025))}, "page_token"},
		"token, other filter":  {&curatorv1.ListNodesRequest{Filter: "false", PageToken: first.NextPageToken}, "another filter or view"},
		"token, other view":    {&curatorv1.ListNodesRequest{Filter: "true", View: curatorv1.NodeView_NODE_VIEW_FULL, PageToken: first.NextPageToken}, "another filter or view"},
		"bad filter":           {&curatorv1.ListNodesRequest{Filter: "node.nope"}, "filter"},
		"filter not boolean":   {&curatorv1.ListNodesRequest{Filter: "node.id"}, "boolean"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := m.ListNodes(ctx, tc.req)
			wantCode(t, err, codes.InvalidArgument, tc.contains)
		})
	}
	// The token goes on with the same filter and view, whatever the page size.
	next, err := m.ListNodes(ctx, &curatorv1.ListNodesRequest{PageSize: 1000, Filter: "true", PageToken: first.NextPageToken})
	if err != nil || len(next.Nodes) != 2 || next.NextPageToken != "" {
		t.Fatalf("second page: %v, %v", next, err)
	}
	for _, who := range []pki.Principal{{Kind: pki.KindReconciler}, {Kind: pki.KindCurator}, {Kind: pki.KindNode, Name: c.Voters[0].ID}} {
		_, err := curatorv1.NewManagementClient(c.Conn(c.Running(), who)).ListNodes(context.Background(), &curatorv1.ListNodesRequest{})
		wantCode(t, err, codes.PermissionDenied, "")
	}
}
