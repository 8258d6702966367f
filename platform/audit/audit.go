// Package audit writes the cluster's audit log: one curia.audit.v1.Event per
// membership or role change, put in the same etcd transaction as the fence
// check that allows the change, so the log has an entry for every change
// that happened (and, for changes interrupted afterwards, for their intent).
package audit

import (
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	"curia.dev/platform/keys"
)

// Put returns the operation that records ev, stamped now. ev.RecordedBy must
// be set: it keeps keys of events recorded in the same nanosecond apart.
func Put(ev *auditv1.Event) clientv3.Op {
	now := time.Now()
	ev = proto.Clone(ev).(*auditv1.Event)
	ev.Time = timestamppb.New(now)
	b, err := proto.Marshal(ev)
	if err != nil {
		panic("marshal audit event: " + err.Error()) // cannot happen for a valid message
	}
	return clientv3.OpPut(keys.Audit(now, strings.ReplaceAll(ev.RecordedBy, "/", "-")), string(b))
}

// Truncate cuts a reason to at most n bytes, on a character boundary:
// requests' reasons are at most 1,024 bytes (their buf.validate rules), and
// the curator cuts its own events' at 2,048.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
