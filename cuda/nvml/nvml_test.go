package nvml

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestNothingIsCalledAfterAFailedInit(t *testing.T) {
	initErr := errors.New("nvml: init: Driver Not Loaded (NVML error 9)")
	f := &fakeLibrary{initErr: initErr, gpus: []fakeGPU{{name: "A100"}}}

	sys, err := Discover(f)
	if !errors.Is(err, initErr) || sys != nil {
		t.Errorf("Discover = %v, %v; want nil and the init error", sys, err)
	}
	n, err := CountVisible(f, noEnv)
	if !errors.Is(err, initErr) || n != 0 {
		t.Errorf("CountVisible = %d, %v; want 0 and the init error", n, err)
	}
	if want := []string{"Init", "Init"}; !slices.Equal(f.calls, want) {
		t.Errorf("calls = %q; want only %q", f.calls, want)
	}
}

func TestDiscoverDescribesEveryDeviceAndShutsDown(t *testing.T) {
	f := &fakeLibrary{gpus: []fakeGPU{
		{name: "NVIDIA H100 80GB HBM3", uuid: "GPU-aaaa", bus: "00000000:18:00.0", memory: 80 << 30},
		{name: "NVIDIA H100 80GB HBM3", uuid: "GPU-bbbb", bus: "00000000:2A:00.0", memory: 80 << 30, nameErr: errors.New("GPU is lost")},
	}}
	sys, err := Discover(f)
	if err != nil {
		t.Fatal(err)
	}
	if sys.DriverVersion != "550.54.15" || CUDAVersion(sys.CUDADriverVersion) != "12.4" {
		t.Errorf("driver %q, CUDA %q", sys.DriverVersion, CUDAVersion(sys.CUDADriverVersion))
	}
	want := []GPU{
		{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-aaaa", BusID: "00000000:18:00.0", MemoryTotal: 80 << 30},
		{Index: 1, UUID: "GPU-bbbb", BusID: "00000000:2A:00.0", MemoryTotal: 80 << 30},
	}
	if !slices.Equal(sys.GPUs, want) {
		t.Errorf("GPUs = %+v\nwant %+v", sys.GPUs, want)
	}
	// A lost name is reported, not fatal: the GPU still counts.
	if sys.Partial == nil || !strings.Contains(sys.Partial.Error(), "GPU1 name: GPU is lost") {
		t.Errorf("Partial = %v; want it to name GPU1's lost name", sys.Partial)
	}
	if len(sys.Links) != 2 || len(sys.Links[0]) != 2 {
		t.Errorf("Links = %v; want a 2x2 matrix", sys.Links)
	}
	if f.calls[0] != "Init" || f.calls[len(f.calls)-1] != "Shutdown" {
		t.Errorf("calls = %q; want Init first and Shutdown last", f.calls)
	}
}

func TestOneGPUHasNoLinks(t *testing.T) {
	f := &fakeLibrary{gpus: []fakeGPU{{name: "T4", uuid: "GPU-1", bus: "00000000:01:00.0"}}}
	sys, err := Discover(f)
	if err != nil || len(sys.GPUs) != 1 || sys.Links != nil {
		t.Fatalf("Discover = %+v, %v; want one GPU and no links", sys, err)
	}
	for _, c := range f.calls {
		if strings.HasPrefix(c, "CommonAncestor") || strings.HasPrefix(c, "P2PStatus") || strings.HasPrefix(c, "NVLink") {
			t.Errorf("asked %q about a single GPU", c)
		}
	}
}

func TestDiscoverFailsWhenADeviceCannotBeReached(t *testing.T) {
	f := &fakeLibrary{gpus: []fakeGPU{{name: "A"}}}
	broken := brokenDevice{fakeSession{f}}
	sys, err := Discover(libraryOf{broken})
	if err == nil || sys != nil || !strings.Contains(err.Error(), "nvml: device 0 of 1: unknown error") {
		t.Errorf("Discover = %v, %v; want an error naming device 0", sys, err)
	}
	if f.calls[len(f.calls)-1] != "Shutdown" {
		t.Errorf("calls = %q; a failed Discover after Init must still shut NVML down", f.calls)
	}
}

// brokenDevice is a session whose devices cannot be reached.
type brokenDevice struct{ fakeSession }

func (brokenDevice) Device(int) (Device, error) { return nil, errors.New("unknown error") }

// libraryOf is a Library whose Init always gives s.
type libraryOf struct{ s Session }

func (l libraryOf) Init() (Session, error) { return l.s, nil }

func TestCUDAVersion(t *testing.T) {
	for v, want := range map[int]string{12040: "12.4", 11080: "11.8", 13000: "13.0", 0: "unknown"} {
		if got := CUDAVersion(v); got != want {
			t.Errorf("CUDAVersion(%d) = %q; want %q", v, got, want)
		}
	}
}

func noEnv(string) (string, bool) { return "", false }
