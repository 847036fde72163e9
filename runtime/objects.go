package runtime

import (
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"slices"
)

// The object collectives carry Go values of any type encoding/gob can
// encode, as torch's *_object collectives carry pickled Python objects.
// Each is two collectives: one for the sizes of the encoded values, one
// for the values. A rank that cannot encode its value announces a size of
// -1, so every rank fails, naming it, instead of waiting for a value that
// never comes.

// cannotEncode is the size a rank announces when encoding failed.
const cannotEncode = -1

// BroadcastObject copies root's *v into every rank's *v.
func BroadcastObject[T any](ctx context.Context, pg *ProcessGroup, v *T, root int) error {
	const op = "broadcast_object"
	var encoded []byte
	size := []int64{0}
	var encodeErr error
	if pg.Rank() == root {
		encoded, encodeErr = encode(*v)
		size[0] = sizeOf(encoded, encodeErr)
	}
	if err := pg.Broadcast(ctx, Of(size), root); err != nil {
		return &OpError{Op: op, Err: err}
	}
	if err := encodeFailure(op, encodeErr, announcedBy(root, size[0])); err != nil {
		return err
	}
	if pg.Rank() != root {
		encoded = make([]byte, size[0])
	}
	if err := pg.Broadcast(ctx, Of(encoded), root); err != nil {
		return &OpError{Op: op, Err: err}
	}
	if pg.Rank() == root {
		return nil
	}
	return decode(op, encoded, v)
}

// AllGatherObject returns every rank's v, in rank order, on every rank.
func AllGatherObject[T any](ctx context.Context, pg *ProcessGroup, v T) ([]T, error) {
	const op = "all_gather_object"
	encoded, sizes, err := shareSizes(ctx, op, pg, v)
	if err != nil {
		return nil, err
	}
	width := int(slices.Max(sizes))
	all := make([]byte, width*pg.Size())
	if err := pg.AllGatherInto(ctx, Of(all), Of(padded(encoded, width))); err != nil {
		return nil, &OpError{Op: op, Err: err}
	}
	return decodeAll[T](op, all, sizes, width)
}

// GatherObject returns every rank's v, in rank order, on root, and nil on
// the other ranks.
func GatherObject[T any](ctx context.Context, pg *ProcessGroup, v T, root int) ([]T, error) {
	const op = "gather_object"
	encoded, sizes, err := shareSizes(ctx, op, pg, v)
	if err != nil {
		return nil, err
	}
	width := int(slices.Max(sizes))
	var all []byte
	var out []Tensor // root's only
	if pg.Rank() == root {
		all = make([]byte, width*pg.Size())
		for r := range pg.Size() {
			out = append(out, Of(all[r*width:(r+1)*width]))
		}
	}
	if err := pg.Gather(ctx, out, Of(padded(encoded, width)), root); err != nil {
		return nil, &OpError{Op: op, Err: err}
	}
	if pg.Rank() != root {
		return nil, nil
	}
	return decodeAll[T](op, all, sizes, width)
}

// ScatterObject returns root's in[rank] on every rank; in holds one value
// per rank on root and is ignored elsewhere.
func ScatterObject[T any](ctx context.Context, pg *ProcessGroup, in []T, root int) (T, error) {
	const op = "scatter_object"
	var v T
	sizes := make([]int64, pg.Size())
	var encoded [][]byte
	var encodeErr error
	if pg.Rank() == root {
		encoded, encodeErr = encodeList(in, pg.Size())
		for r := range sizes {
			sizes[r] = cannotEncode
			if encodeErr == nil {
				sizes[r] = int64(len(encoded[r]))
			}
		}
	}
	if err := pg.Broadcast(ctx, Of(sizes), root); err != nil {
		return v, &OpError{Op: op, Err: err}
	}
	if err := encodeFailure(op, encodeErr, announcedBy(root, sizes[0])); err != nil {
		return v, err
	}
	width := int(slices.Max(sizes))
	pieces := make([]Tensor, len(encoded))
	for r, e := range encoded {
		pieces[r] = Of(padded(e, width))
	}
	mine := make([]byte, width)
	if err := pg.Scatter(ctx, Of(mine), pieces, root); err != nil {
		return v, &OpError{Op: op, Err: err}
	}
	return v, decode(op, mine[:sizes[pg.Rank()]], &v)
}

// shareSizes encodes v and all-gathers the size every rank's value
// encodes to.
func shareSizes[T any](ctx context.Context, op string, pg *ProcessGroup, v T) ([]byte, []int64, error) {
	encoded, encodeErr := encode(v)
	sizes := make([]int64, pg.Size())
	if err := pg.AllGatherInto(ctx, Of(sizes), Of([]int64{sizeOf(encoded, encodeErr)})); err != nil {
		return nil, nil, &OpError{Op: op, Err: err}
	}
	var failed []int
	for r, size := range sizes {
		failed = append(failed, announcedBy(r, size)...)
	}
	if err := encodeFailure(op, encodeErr, failed); err != nil {
		return nil, nil, err
	}
	return encoded, sizes, nil
}

// encodeFailure is this rank's own encoding error, else an error naming
// the ranks that failed to encode their values; nil when none did.
func encodeFailure(op string, own error, failed []int) error {
	switch {
	case own != nil:
		return &OpError{Op: op, Err: own}
	case failed != nil:
		return &OpError{Op: op, Err: fmt.Errorf("ranks %v could not encode their values", failed)}
	}
	return nil
}

// announcedBy returns [rank] when the size rank announced says it could
// not encode its value.
func announcedBy(rank int, size int64) []int {
	if size == cannotEncode {
		return []int{rank}
	}
	return nil
}

func sizeOf(encoded []byte, err error) int64 {
	if err != nil {
		return cannotEncode
	}
	return int64(len(encoded))
}

func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return b.Bytes(), nil
}

func encodeList[T any](in []T, size int) ([][]byte, error) {
	if len(in) != size {
		return nil, invalid("in has %d values, want %d: one per rank", len(in), size)
	}
	encoded := make([][]byte, len(in))
	for i, v := range in {
		var err error
		if encoded[i], err = encode(v); err != nil {
			return nil, fmt.Errorf("in[%d]: %w", i, err)
		}
	}
	return encoded, nil
}

func decode[T any](op string, encoded []byte, v *T) error {
	if err := gob.NewDecoder(bytes.NewReader(encoded)).Decode(v); err != nil {
		return &OpError{Op: op, Err: fmt.Errorf("decode %T: %w", v, err)}
	}
	return nil
}

// decodeAll decodes the values laid out width bytes apart in all.
func decodeAll[T any](op string, all []byte, sizes []int64, width int) ([]T, error) {
	values := make([]T, len(sizes))
	for r, size := range sizes {
		if err := decode(op, all[r*width:r*width+int(size)], &values[r]); err != nil {
			return nil, err
		}
	}
	return values, nil
}

// padded returns b grown with zeros to width bytes.
func padded(b []byte, width int) []byte {
	return append(b, make([]byte, width-len(b))...)
}
