package rpc

import (
	"context"
	"errors"
	"strings"
	"sync"

	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Validation (interceptor layer 5) checks every request against the
// protovalidate rules declared next to its message in proto/ (buf.validate
// annotations, and curia's shared ones in curia/validate/v1/rules.proto).
// Structural rules live there, once per message; handlers check only what
// needs state or the caller (the cluster CA, this node's own peer URL, the
// fence's shape and freshness).
//
// A request that breaks a rule is InvalidArgument, before any handler runs.
// The message names every violation as "field.path: what is wrong
// [rule id]"; the details carry a google.rpc.BadRequest with one field
// violation each (field, description, reason = the rule id) and
// protovalidate's own buf.validate.Violations.
//
// It is built on protovalidate directly rather than on go-grpc-middleware's
// interceptors/protovalidate, which reports only buf.validate.Violations:
// BadRequest is what generic gRPC clients and grpcurl understand.

// validator is shared by every server of the process. It compiles the
// rules of every registered curia message when first used, and never
// lazily after: protovalidate's lazy building, concurrent with validations
// on other goroutines, is a data race the race detector found in the
// consensus process (protovalidate v1.4.0, builder.processFields). Other
// messages (gRPC health, reflection) carry no curia rules and are not
// validated.
var validator = sync.OnceValues(func() (*compiledRules, error) {
	descs := curiaMessages()
	v, err := protovalidate.New(protovalidate.WithMessageDescriptors(descs...), protovalidate.WithDisableLazy())
	if err != nil {
		return nil, err
	}
	known := make(map[protoreflect.FullName]bool, len(descs))
	for _, d := range descs {
		known[d.FullName()] = true
	}
	return &compiledRules{v, known}, nil
})

// compiledRules is a validator and the messages it has rules for.
type compiledRules struct {
	protovalidate.Validator
	known map[protoreflect.FullName]bool
}

// curiaMessages are the descriptors of every message, nested ones too, in
// the registered files of curia's proto packages.
func curiaMessages() []protoreflect.MessageDescriptor {
	var out []protoreflect.MessageDescriptor
	var add func(protoreflect.MessageDescriptors)
	add = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			out = append(out, ms.Get(i))
			add(ms.Get(i).Messages())
		}
	}
	eachCuriaFile(func(f protoreflect.FileDescriptor) { add(f.Messages()) })
	return out
}

// eachCuriaFile calls f with every registered file of curia's proto
// packages (curia.*): the files whose messages the validator checks and
// whose methods clients retry (declaredWithoutSideEffects).
func eachCuriaFile(f func(protoreflect.FileDescriptor)) {
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if strings.HasPrefix(string(fd.Package()), "curia.") {
			f(fd)
		}
		return true
	})
}

// ValidateRequest checks msg against its rules and returns nil, an
// InvalidArgument status naming the violations, or Internal if the rules
// themselves do not compile (a defect in proto/, never the caller's).
func ValidateRequest(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "request of type %T is not a protobuf message", msg)
	}
	v, err := validator()
	if err != nil {
		return status.Errorf(codes.Internal, "request validation unavailable: %v", err)
	}
	if !v.known[m.ProtoReflect().Descriptor().FullName()] {
		return nil
	}
	err = v.Validate(m)
	if err == nil {
		return nil
	}
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		return status.Errorf(codes.Internal, "validate %s: %v", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return violationsStatus(verr)
}

// violationsStatus turns a validation error into InvalidArgument with
// details.
func violationsStatus(verr *protovalidate.ValidationError) error {
	br := &errdetails.BadRequest{}
	parts := make([]string, 0, len(verr.Violations))
	for _, v := range verr.Violations {
		field := protovalidate.FieldPathString(v.Proto.GetField())
		if v.Proto.GetForKey() {
			field += " (key)"
		}
		desc := v.Proto.GetMessage()
		if desc == "" {
			desc = "breaks rule " + v.Proto.GetRuleId()
		}
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
			Field:       field,
			Description: desc,
			Reason:      v.Proto.GetRuleId(),
		})
		part := desc + " [" + v.Proto.GetRuleId() + "]"
		if field != "" {
			part = field + ": " + part
		}
		parts = append(parts, part)
	}
	st := status.New(codes.InvalidArgument, "invalid request: "+strings.Join(parts, "; "))
	if withDetails, err := st.WithDetails(br, verr.ToProto()); err == nil {
		st = withDetails
	}
	return st.Err()
}

func validateUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := ValidateRequest(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func validateStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &validatingStream{ServerStream: ss})
}

// validatingStream checks every message the client sends.
type validatingStream struct {
	grpc.ServerStream
}

func (s *validatingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return ValidateRequest(m)
}

// FieldViolations returns the google.rpc.BadRequest field violations an
// error from a curia server carries (none for other errors): which field
// broke which rule (Reason is the rule id).
func FieldViolations(err error) []*errdetails.BadRequest_FieldViolation {
	var out []*errdetails.BadRequest_FieldViolation
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			out = append(out, br.GetFieldViolations()...)
		}
	}
	return out
}
