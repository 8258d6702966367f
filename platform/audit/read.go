package audit

import (
	"context"
	"errors"
	"io"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// Backlog reads the audit log as a curator serves it (m), oldest first: up
// to max events, without following.
func Backlog(ctx context.Context, m curatorv1.ManagementClient, max int64) ([]*auditv1.Event, error) {
	stream, err := m.WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{Backlog: max, NoFollow: true})
	if err != nil {
		return nil, err
	}
	var out []*auditv1.Event
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetEvent())
	}
}
