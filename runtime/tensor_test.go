package runtime

import (
	"testing"
)

func TestTensorSharesMemory(t *testing.T) {
	s := []float32{1, 2, 3, 4}
	tensor := Of(s)
	if tensor.DType() != Float32 || tensor.Len() != 4 || len(tensor.Bytes()) != 16 {
		t.Fatalf("Of([]float32 x 4) = %s with %d bytes", tensor, len(tensor.Bytes()))
	}
	s[2] = 30
	if got := Elems[float32](tensor)[2]; got != 30 {
		t.Errorf("after s[2] = 30, the tensor holds %v", got)
	}
	Elems[float32](tensor)[0] = 10
	if s[0] != 10 {
		t.Errorf("after writing through the tensor, s[0] = %v", s[0])
	}
	tail := tensor.Slice(2, 4)
	Elems[float32](tail)[1] = 40
	if s[3] != 40 || tail.Len() != 2 {
		t.Errorf("Slice(2, 4) does not share memory: s = %v, tail = %v", s, Elems[float32](tail))
	}
}

func TestTensorDTypes(t *testing.T) {
	for _, tc := range []struct {
		tensor Tensor
		dtype  DType
		bytes  int
	}{
		{Of([]int8{1, 2}), Int8, 2},
		{Of([]uint8{1, 2}), Uint8, 2},
		{Of([]int32{1, 2}), Int32, 8},
		{Of([]int64{1, 2}), Int64, 16},
		{Of([]float32{1, 2}), Float32, 8},
		{Of([]float64{1, 2}), Float64, 16},
		{Float16s([]uint16{1, 2}), Float16, 4},
		{BFloat16s([]uint16{1, 2}), BFloat16, 4},
	} {
		if tc.tensor.DType() != tc.dtype || tc.tensor.Len() != 2 || len(tc.tensor.Bytes()) != tc.bytes {
			t.Errorf("%s: want %s x 2 in %d bytes, got %d bytes", tc.tensor, tc.dtype, tc.bytes, len(tc.tensor.Bytes()))
		}
	}
}

func TestTensorHalves(t *testing.T) {
	bits := []uint16{ToFloat16(1.5), ToFloat16(-2)}
	h := Float16s(bits)
	if got := FromFloat16(h.HalfBits()[0]); got != 1.5 {
		t.Errorf("float16 1.5 reads back as %v", got)
	}
	if got := FromBFloat16(BFloat16s([]uint16{ToBFloat16(3)}).HalfBits()[0]); got != 3 {
		t.Errorf("bfloat16 3 reads back as %v", got)
	}
}

func TestTensorEmpty(t *testing.T) {
	var zero Tensor
	if zero.Len() != 0 || zero.DType() != Int8 || len(Elems[int8](zero)) != 0 {
		t.Errorf("zero Tensor = %s", zero)
	}
	empty := Of([]float64{})
	if empty.Len() != 0 || empty.DType() != Float64 || Elems[float64](empty) != nil {
		t.Errorf("Of(empty) = %s", empty)
	}
}

func TestTensorMisusePanics(t *testing.T) {
	for name, misuse := range map[string]func(){
		"wrong element type":  func() { Elems[int32](Of([]float32{1})) },
		"slice out of range":  func() { Of([]float32{1}).Slice(0, 2) },
		"slice backwards":     func() { Of([]float32{1, 2}).Slice(2, 1) },
		"half bits of floats": func() { Of([]float32{1}).HalfBits() },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			misuse()
		}()
	}
}
