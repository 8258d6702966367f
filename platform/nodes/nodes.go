// Package nodes reads the node registry as the curators serve it
// (Management/GetNodes, or ListNodes page after page), for the tools that
// need all of it at once.
package nodes

import (
	"context"
	"errors"
	"io"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// List returns every node that matches filter (a GetNodes CEL filter; ""
// matches all), sorted by id, read to the end of the stream.
func List(ctx context.Context, m curatorv1.ManagementClient, filter string) ([]*curatorv1.Node, error) {
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	var out []*curatorv1.Node
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetNodes()...)
	}
}

// ListBasic returns every node that matches filter as List does, but
// without certificate and CRL bytes (NODE_VIEW_BASIC), read with ListNodes
// page after page: for callers that show nodes and never their
// certificates. A node created or deleted meanwhile may or may not be in
// it; every other node is, once.
func ListBasic(ctx context.Context, m curatorv1.ManagementClient, filter string) ([]*curatorv1.Node, error) {
	req := &curatorv1.ListNodesRequest{Filter: filter, View: curatorv1.NodeView_NODE_VIEW_BASIC, PageSize: 1000}
	var out []*curatorv1.Node
	for {
		resp, err := m.ListNodes(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetNodes()...)
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return out, nil
		}
	}
}

// ByID is List keyed by node id.
func ByID(ctx context.Context, m curatorv1.ManagementClient, filter string) (map[string]*curatorv1.Node, error) {
	list, err := List(ctx, m, filter)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*curatorv1.Node, len(list))
	for _, n := range list {
		out[n.GetId()] = n
	}
	return out, nil
}
