package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// marshalJSON renders m for -o json: protojson (lowerCamelCase field
// names, enums by name), indented when indent is set, else on one line.
// protojson varies its whitespace from build to build on purpose; it is
// normalized here so that the output of a given message is always the same.
func marshalJSON(m proto.Message, indent bool) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if indent {
		err = json.Indent(&out, b, "", "  ")
	} else {
		err = json.Compact(&out, b)
	}
	return out.Bytes(), err
}

// printMessage writes m as JSON or YAML (format), or calls table.
func printMessage(w io.Writer, format string, m proto.Message, table func(w io.Writer)) error {
	switch format {
	case "json":
		b, err := marshalJSON(m, true)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := toYAML(m)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := newTable(w)
	table(tw)
	return tw.Flush()
}

// toYAML is m's protojson as YAML (the same field names).
func toYAML(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(b)
}

// newTable is an aligned table: cells separated by tabs, two spaces apart.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// row writes one table row.
func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// enumName drops an enum value's type prefix: NODE_STATE_UP -> UP.
func enumName(name, prefix string) string {
	if name == "" {
		return "-"
	}
	return strings.TrimPrefix(name, prefix)
}

// orDash is s, or "-" when s is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ago is how long before now t was ("never" for none), to the second.
func ago(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "never"
	}
	d := now.Sub(t.AsTime())
	if d < 0 {
		d = 0
	}
	return humanDuration(d) + " ago"
}

// humanDuration is d rounded for a person: 45s, 3m12s, 5h3m, 4d2h.
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return strings.TrimSuffix(d.Round(time.Second).String(), "0s")
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	days := d / (24 * time.Hour)
	return fmt.Sprintf("%dd%dh", days, (d-days*24*time.Hour)/time.Hour)
}

// timestamp is t in UTC, RFC 3339 to the second ("-" for none).
func timestamp(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// roles lists a node's roles, "-" for none.
func roles(r *curatorv1.Roles) string {
	var out []string
	if r.GetConsensusMember() != nil {
		out = append(out, "consensus-member")
	}
	if r.GetKubernetesController() != nil {
		out = append(out, "kubernetes-controller")
	}
	if r.GetKubernetesWorker() != nil {
		out = append(out, "kubernetes-worker")
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

// redact is a copy of n without certificate bytes (the member certificate,
// and the CA certificate and CRL of its join parameters): curiactl never
// prints them.
func redact(n *curatorv1.Node) *curatorv1.Node {
	n = proto.CloneOf(n)
	if cm := n.GetRoles().GetConsensusMember(); cm != nil {
		cm.MemberCertificate = nil
		if j := cm.GetJoin(); j != nil {
			j.CaCertificate, j.Crl = nil, nil
		}
	}
	return n
}

// bytesSize is n bytes for a person: 512 B, 1.5 KiB, 20.0 MiB.
func bytesSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
