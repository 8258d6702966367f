package records

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rpcerr"
)

// A cluster configuration changed through a field mask, and checked as a
// whole: by the curator's UpdateClusterConfig, and by the reconciler's
// Plan for a proposed configuration, alike.

// configFields are the paths a ClusterConfig mask may name, in the
// order of ClusterConfig.
var configFields = func() []string {
	fields := (&curatorv1.ClusterConfig{}).ProtoReflect().Descriptor().Fields()
	names := make([]string, fields.Len())
	for i := range fields.Len() {
		names[i] = string(fields.Get(i).Name())
	}
	return names
}()

// ClusterConfigWithMask is cur with the fields paths name taken from in. The request's
// contract allows only ClusterConfig's fields as paths; a masked duration
// must be set (a mask clears nothing).
func ClusterConfigWithMask(cur, in *curatorv1.ClusterConfig, paths []string) (*curatorv1.ClusterConfig, error) {
	next := proto.Clone(cur).(*curatorv1.ClusterConfig)
	src, dst := in.ProtoReflect(), next.ProtoReflect()
	fields := dst.Descriptor().Fields()
	for _, p := range paths {
		f := fields.ByName(protoreflect.Name(p))
		if f == nil {
			return nil, fmt.Errorf("%w: update_mask: unknown path %q: paths are the fields of ClusterConfig (%s)", rpcerr.Invalid, p, strings.Join(configFields, ", "))
		}
		if f.Message() != nil && !src.Has(f) {
			return nil, fmt.Errorf("%w: config.%s is in update_mask but not set: give it a value (the default is %s)", rpcerr.Invalid, p, ClusterConfigValue(DefaultClusterConfig(), f))
		}
		dst.Set(f, src.Get(f))
	}
	return next, nil
}

// CheckClusterConfig checks what no single field's rule can: the config an
// update leaves. The request's contract checked each field it set, but a
// partial update combines them with the stored ones.
func CheckClusterConfig(c *curatorv1.ClusterConfig) error {
	if c.GetMinQuorum() < 1 {
		return fmt.Errorf("%w: config.min_quorum must be 1 to 7, not %d", rpcerr.Invalid, c.GetMinQuorum())
	}
	if size := c.GetControlPlaneSize(); size > 0 && c.GetMinQuorum() > size {
		return fmt.Errorf("%w: config.min_quorum %d exceeds config.control_plane_size %d: automation could never keep that many voters (lower min_quorum, or raise control_plane_size)", rpcerr.Invalid, c.GetMinQuorum(), size)
	}
	return nil
}

// ClusterConfigValue renders field f of c for humans: durations as Go durations
// (5m0s), strings quoted.
func ClusterConfigValue(c *curatorv1.ClusterConfig, f protoreflect.FieldDescriptor) string {
	v := c.ProtoReflect().Get(f)
	switch {
	case f.Message() != nil:
		d, _ := v.Message().Interface().(*durationpb.Duration)
		return d.AsDuration().String()
	case f.Kind() == protoreflect.StringKind:
		return strconv.Quote(v.String())
	default:
		return v.String()
	}
}
