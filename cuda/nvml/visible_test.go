package nvml

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func fourGPUs() []GPU {
	return []GPU{
		{Index: 0, UUID: "GPU-0aa1b2c3-0000"},
		{Index: 1, UUID: "GPU-1bb2c3d4-1111"},
		{Index: 2, UUID: "GPU-1bc3d4e5-2222"},
		{Index: 3, UUID: "GPU-3dd4e5f6-3333"},
	}
}

func TestVisibleReadsTheListAsCUDADoes(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []int // NVML indices, in CUDA's order
	}{
		{"0,1,2,3", []int{0, 1, 2, 3}},
		{"3,1", []int{3, 1}},
		{" 2 , 0 ", []int{2, 0}},
		{"1gpu,+2", []int{1, 2}},           // strtoul: the leading digits
		{"", nil},                          // empty: no GPU
		{"-1", nil},                        // -1: no GPU
		{"0,-1,1", []int{0}},               // a negative entry ends the list
		{"1,7,2", []int{1}},                // so does an index past the last GPU
		{"0,x,1", []int{0}},                // and one without digits
		{"0,1,0", nil},                     // a GPU named twice hides all
		{"GPU-3dd4,GPU-0aa1", []int{3, 0}}, // UUID prefixes
		{"GPU-1b,GPU-3", nil},              // ambiguous first prefix: nothing
		{"GPU-3,GPU-1b,GPU-0", []int{3}},   // ambiguous later prefix ends the list
		{"GPU-3,2", []int{3}},              // the first entry decides the kind
		{"GPU-0aa1,GPU-0aa1b2", nil},       // the same GPU twice
		{"GPU-ffff", nil},                  // no such GPU
		{"GPU-1bc3d4e5-2222,GPU-1bb", []int{2, 1}},
	} {
		got, err := Visible(fourGPUs(), tc.value)
		if err != nil {
			t.Errorf("Visible(%q): %v", tc.value, err)
			continue
		}
		var idx []int
		for _, g := range got {
			idx = append(idx, g.Index)
		}
		if !slices.Equal(idx, tc.want) {
			t.Errorf("Visible(%q) = %v; want %v", tc.value, idx, tc.want)
		}
	}
}

func TestVisibleRefusesMIGDevices(t *testing.T) {
	_, err := Visible(fourGPUs(), "MIG-5c0f6a2e-7a36-5e2a-8f1a-1c2d3e4f5a6b")
	if err == nil || !strings.Contains(err.Error(), "MIG") || !strings.Contains(err.Error(), "number of workers") {
		t.Errorf("err = %v; want it to say MIG devices need an explicit count", err)
	}
}

func TestCountVisible(t *testing.T) {
	f := &fakeLibrary{gpus: []fakeGPU{{uuid: "GPU-a"}, {uuid: "GPU-b"}, {uuid: "GPU-c"}}}
	env := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			if k == "CUDA_VISIBLE_DEVICES" {
				return v, true
			}
			return "", false
		}
	}
	if n, err := CountVisible(f, noEnv); n != 3 || err != nil {
		t.Errorf("unset: %d, %v; want all 3", n, err)
	}
	if n, err := CountVisible(f, env("2,0")); n != 2 || err != nil {
		t.Errorf("2,0: %d, %v; want 2", n, err)
	}
	if n, err := CountVisible(f, env("GPU-c")); n != 1 || err != nil {
		t.Errorf("GPU-c: %d, %v; want 1", n, err)
	}
	for _, hidden := range []string{"", "-1", "5", "1,1"} {
		n, err := CountVisible(f, env(hidden))
		if n != 0 || err == nil || !strings.Contains(err.Error(), `CUDA_VISIBLE_DEVICES="`+hidden+`" hides all 3 GPUs`) {
			t.Errorf("%q: %d, %v; want 0 and why all are hidden", hidden, n, err)
		}
	}
	// No GPU at all is no error: there is nothing to hide.
	if n, err := CountVisible(&fakeLibrary{}, env("0")); n != 0 || err != nil {
		t.Errorf("no GPUs: %d, %v; want 0, nil", n, err)
	}
	_, err := CountVisible(f, env("MIG-x"))
	if err == nil || errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("MIG: %v; want the MIG error", err)
	}
}
