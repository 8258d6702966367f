package rpc

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Encoded is a message marshalled once, to be sent as it is on any number
// of a Server's streams (stream.SendMsg(e)): a change fanned out to many
// watchers costs one marshal instead of one per stream. Each stream still
// frames, compresses (if the client asked for it) and counts it as any
// other message. Its bytes are never changed once made.
type Encoded struct{ b []byte }

// Encode marshals m for sending on many streams.
func Encode(m proto.Message) (*Encoded, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	return &Encoded{b: b}, nil
}

// encodedCodec is every Server's codec: protobuf, except that an *Encoded
// goes out as its bytes. gRPC frees what Marshal returns once it is
// written; a SliceBuffer's Free does nothing, so the shared bytes stay.
type encodedCodec struct{ proto encoding.CodecV2 }

func newEncodedCodec() encodedCodec {
	return encodedCodec{proto: encoding.GetCodecV2(protocodec.Name)}
}

func (c encodedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*Encoded); ok {
		return mem.BufferSlice{mem.SliceBuffer(e.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c encodedCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// Name is protobuf's: the codec is protobuf on the wire.
func (c encodedCodec) Name() string { return protocodec.Name }
