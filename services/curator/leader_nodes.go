package curator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// getNodesBatch is the most nodes one GetNodes message carries.
const getNodesBatch = 1000

// GetNodes streams the nodes that match the filter, a batch at a time, from
// the watch hub's view at etcd's current revision or later (a linearizable
// read that reads no node from etcd): the nodes carry their health, so
// filters can use node.health. Its view defaults to FULL, as GetNodes
// answered before views existed.
func (x *managementServer) GetNodes(req *curatorv1.GetNodesRequest, stream curatorv1.Management_GetNodesServer) error {
	match, err := compileFilter(req.GetFilter())
	if err != nil {
		return err
	}
	view := req.GetView()
	if view == curatorv1.NodeView_NODE_VIEW_UNSPECIFIED {
		view = curatorv1.NodeView_NODE_VIEW_FULL
	}
	nodes, err := x.s.watch.CurrentNodes(stream.Context())
	if err != nil {
		return err
	}
	out := make([]*curatorv1.Node, 0, min(len(nodes), getNodesBatch))
	for _, n := range nodes {
		ok, err := match(n)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if out = append(out, inView(n, view)); len(out) == getNodesBatch {
			if err := stream.Send(&curatorv1.GetNodesResponse{Nodes: out}); err != nil {
				return err
			}
			out = out[:0]
		}
	}
	if len(out) == 0 {
		return nil
	}
	return stream.Send(&curatorv1.GetNodesResponse{Nodes: out})
}

// ListNodes pages (default and most nodes per page).
const (
	listNodesPageSize = 500
	listNodesMaxPage  = 1000 // ListNodesRequest's contract checks it
)

// ListNodes answers one page of GetNodes' listing, from the same view of
// the hub. A page starts after the last id of the page before (the token),
// not at an offset, so that nodes created or deleted between pages move
// no other node from one page to another: every node that exists
// throughout a walk is listed exactly once.
func (x *managementServer) ListNodes(ctx context.Context, req *curatorv1.ListNodesRequest) (*curatorv1.ListNodesResponse, error) {
	view := req.GetView()
	if view == curatorv1.NodeView_NODE_VIEW_UNSPECIFIED {
		view = curatorv1.NodeView_NODE_VIEW_BASIC
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = listNodesPageSize
	}
	size = min(size, listNodesMaxPage)
	query := listQueryHash(req.GetFilter(), view)
	after := ""
	if req.GetPageToken() != "" {
		var err error
		if after, err = decodePageToken(req.GetPageToken(), query); err != nil {
			return nil, err
		}
	}
	match, err := compileFilter(req.GetFilter())
	if err != nil {
		return nil, err
	}
	nodes, err := x.s.watch.CurrentNodes(ctx)
	if err != nil {
		return nil, err
	}
	// nodes are sorted by id: skip to the first after the token's.
	start, found := slices.BinarySearchFunc(nodes, after, func(n *curatorv1.Node, id string) int { return strings.Compare(n.GetId(), id) })
	if found {
		start++
	}
	resp := &curatorv1.ListNodesResponse{Nodes: make([]*curatorv1.Node, 0, min(size, len(nodes)-start))}
	for _, n := range nodes[start:] {
		ok, err := match(n)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if len(resp.Nodes) == size {
			// One more matches: this page is not the last.
			resp.NextPageToken = encodePageToken(resp.Nodes[size-1].GetId(), query)
			break
		}
		resp.Nodes = append(resp.Nodes, inView(n, view))
	}
	return resp, nil
}

// inView is n as view shows it. The hub's nodes are shared by every call:
// a node is copied before anything is cleared, and only when there is
// something to clear.
func inView(n *curatorv1.Node, view curatorv1.NodeView) *curatorv1.Node {
	cm := n.GetRoles().GetConsensusMember()
	if view == curatorv1.NodeView_NODE_VIEW_FULL || cm == nil ||
		(len(cm.GetMemberCertificate()) == 0 && len(cm.GetJoin().GetCaCertificate()) == 0 && len(cm.GetJoin().GetCrl()) == 0) {
		return n
	}
	out := shallowCopy(n)
	out.Roles = shallowCopy(out.Roles)
	cm = shallowCopy(cm)
	out.Roles.ConsensusMember = cm
	cm.MemberCertificate = nil
	if cm.Join != nil {
		cm.Join = shallowCopy(cm.Join)
		cm.Join.CaCertificate, cm.Join.Crl = nil, nil
	}
	return out
}

// shallowCopy is a new message with m's fields, sharing m's sub-messages,
// lists and maps, whatever fields m's type gains: inView copies only the
// messages it clears a field of (the nodes it answers are only
// marshalled, never changed).
func shallowCopy[M proto.Message](m M) M {
	src := m.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	return dst.Interface().(M)
}

// A page token is base64url of
//
//	pageTokenVersion | 8 bytes of sha256(view, filter) | last node id
//
// Not secret, only opaque: a token edited by hand moves the walk, which
// the caller may do by asking anyway. The hash refuses a token used with
// another filter or view, whose walk it does not belong to.
const (
	pageTokenVersion = 1
	pageTokenHashLen = 8
)

// listQueryHash identifies a listing (filter and view) within its tokens.
func listQueryHash(filter string, view curatorv1.NodeView) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "%d\x00%s", view, filter)
	return h.Sum(nil)[:pageTokenHashLen]
}

func encodePageToken(lastID string, query []byte) string {
	b := make([]byte, 0, 1+len(query)+len(lastID))
	b = append(b, pageTokenVersion)
	b = append(b, query...)
	b = append(b, lastID...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken returns the last node id of the page before; errors are
// errBadRequest and say what to do.
func decodePageToken(token string, query []byte) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) <= 1+pageTokenHashLen || b[0] != pageTokenVersion {
		return "", fmt.Errorf("%w: page_token is not a next_page_token that ListNodes returned; send it unchanged, or leave it empty to start from the first page", errBadRequest)
	}
	if !bytes.Equal(b[1:1+pageTokenHashLen], query) {
		return "", fmt.Errorf("%w: page_token belongs to a listing with another filter or view; send the filter and view of the call that returned it, or leave page_token empty to start again", errBadRequest)
	}
	return string(b[1+pageTokenHashLen:]), nil
}
