package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

func (a *app) configCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Read and change the cluster configuration (autopilot's settings)",
		Example: `  curiactl config get
  curiactl config set control_plane_size=5 --dry-run`,
	}
	cmd.AddCommand(a.configGetCmd(), a.configSetCmd())
	return cmd
}

// configTable is the cluster configuration, one field a line, as
// config set names them.
func configTable(w io.Writer, c *curatorv1.ClusterConfig, revision int64) {
	row(w, "KEY", "VALUE")
	fields := c.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		row(w, string(fd.Name()), fieldValue(c.ProtoReflect(), fd))
	}
	row(w, "revision", strconv.FormatInt(revision, 10))
}

// fieldValue renders one field of the configuration as config set takes it.
func fieldValue(m protoreflect.Message, fd protoreflect.FieldDescriptor) string {
	if fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Duration" {
		if !m.Has(fd) {
			return "-"
		}
		d, _ := m.Get(fd).Message().Interface().(*durationpb.Duration)
		return d.AsDuration().String()
	}
	v := m.Get(fd)
	if fd.Kind() == protoreflect.StringKind {
		return strconv.Quote(v.String())
	}
	return v.String()
}

func (a *app) configGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get",
		Short: "Show the cluster configuration and its revision (GetClusterConfig)",
		Long: `Show the cluster configuration (Management/GetClusterConfig), every field
filled in (defaults for those never written), and its revision: pass that
to config set --expected-revision to change only what you read.`,
		Example: `  curiactl config get
  curiactl config get -o json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := a.mgmt()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			resp, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, resp, func(w io.Writer) { configTable(w, resp.GetConfig(), resp.GetRevision()) })
		},
	}
}

// configKeys lists the keys config set takes.
func configKeys() string {
	fields := (&curatorv1.ClusterConfig{}).ProtoReflect().Descriptor().Fields()
	var names []string
	for i := range fields.Len() {
		names = append(names, string(fields.Get(i).Name()))
	}
	return strings.Join(names, ", ")
}

// parseAssignments turns KEY=VALUE arguments into a ClusterConfig and the
// update mask that names them. Keys are ClusterConfig's field names
// (control_plane_size; control-plane-size is taken too).
func parseAssignments(kvs []string) (*curatorv1.ClusterConfig, []string, error) {
	cfg := &curatorv1.ClusterConfig{}
	m := cfg.ProtoReflect()
	fields := m.Descriptor().Fields()
	var paths []string
	for _, kv := range kvs {
		key, value, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, nil, fmt.Errorf("%q: want KEY=VALUE", kv)
		}
		fd := fields.ByName(protoreflect.Name(strings.ReplaceAll(strings.TrimSpace(key), "-", "_")))
		if fd == nil {
			return nil, nil, fmt.Errorf("unknown key %q: the keys are %s", key, configKeys())
		}
		var v protoreflect.Value
		switch {
		case fd.Kind() == protoreflect.Uint32Kind:
			n, err := strconv.ParseUint(value, 10, 32)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %q is no unsigned number", key, value)
			}
			v = protoreflect.ValueOfUint32(uint32(n))
		case fd.Kind() == protoreflect.BoolKind:
			b, err := strconv.ParseBool(value)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %q is not true or false", key, value)
			}
			v = protoreflect.ValueOfBool(b)
		case fd.Kind() == protoreflect.StringKind:
			v = protoreflect.ValueOfString(value)
		case fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Duration":
			d, err := time.ParseDuration(value)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %q is no duration (e.g. 5m, 90s)", key, value)
			}
			v = protoreflect.ValueOfMessage(durationpb.New(d).ProtoReflect())
		default:
			return nil, nil, fmt.Errorf("%s: curiactl cannot set a field of type %s", key, fd.Kind())
		}
		m.Set(fd, v)
		if !slices.Contains(paths, string(fd.Name())) {
			paths = append(paths, string(fd.Name()))
		}
	}
	return cfg, paths, nil
}

func (a *app) configSetCmd() *cobra.Command {
	var dryRun bool
	var expected int64
	var reason string
	cmd := &cobra.Command{
		Use:   "set KEY=VALUE...",
		Short: "Change fields of the cluster configuration (UpdateClusterConfig)",
		Long: `Change the named fields of the cluster configuration, the others left as
they are (Management/UpdateClusterConfig), in one write with its audit
event, and show the configuration after it. Keys are ClusterConfig's
fields: ` + configKeys() + `.
Durations as Go writes them (90s, 5m); booleans true or false.

--dry-run checks the update and shows the configuration it would leave
(validate_only): nothing is written. --expected-revision N updates only if
the stored configuration is still at revision N (config get shows it);
otherwise the call fails with ABORTED, reason CONFLICT.`,
		Example: `  curiactl config set control_plane_size=5 --dry-run
  curiactl config set paused=true pause_reason="disk replacement" --reason "maintenance"
  curiactl config set dead_node_threshold=10m --expected-revision 42`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, kvs []string) error {
			cfg, paths, err := parseAssignments(kvs)
			if err != nil {
				return usageError{err}
			}
			m, err := a.mgmt()
			if err != nil {
				return err
			}
			ctx, cancel := a.call(cmd.Context())
			defer cancel()
			resp, err := m.UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{
				Config: cfg, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
				ValidateOnly: dryRun, Reason: reason, ExpectedRevision: expected,
			})
			if err != nil {
				return err
			}
			return printMessage(a.stdout, a.output, resp, func(w io.Writer) {
				configTable(w, resp.GetConfig(), resp.GetRevision())
				if dryRun {
					row(w, "dry run:", "valid; nothing written")
				}
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check the update and show what it would leave; write nothing (validate_only)")
	cmd.Flags().Int64Var(&expected, "expected-revision", 0, "update only if the configuration's revision is still this (expected_revision; 0: whatever is stored)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	return cmd
}
