package doctor

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/gorun/gorun/cuda/nvml"
)

// twoGPUs is an NVML with two GPUs joined by four NVLinks, for the GPU
// section a host without a driver cannot show end to end.
type twoGPUs struct{}

func (twoGPUs) Init() (nvml.Session, error)       { return twoGPUs{}, nil }
func (twoGPUs) DriverVersion() (string, error)    { return "550.54.15", nil }
func (twoGPUs) CUDADriverVersion() (int, error)   { return 12040, nil }
func (twoGPUs) DeviceCount() (int, error)         { return 2, nil }
func (twoGPUs) Device(i int) (nvml.Device, error) { return fakeGPU(i), nil }
func (twoGPUs) Shutdown() error                   { return nil }

type fakeGPU int

func (g fakeGPU) Name() (string, error)        { return "NVIDIA H100 80GB HBM3", nil }
func (g fakeGPU) UUID() (string, error)        { return fmt.Sprintf("GPU-%d000", g), nil }
func (g fakeGPU) MemoryTotal() (uint64, error) { return 81559 << 20, nil }
func (g fakeGPU) BusID() (string, error)       { return fmt.Sprintf("00000000:%d8:00.0", g), nil }
func (g fakeGPU) CommonAncestor(nvml.Device) (nvml.Level, error) {
	return nvml.LevelSystem, nil
}
func (g fakeGPU) P2PStatus(nvml.Device, nvml.P2PCap) (nvml.P2PStatus, error) { return nvml.P2POK, nil }
func (g fakeGPU) NVLinkActive(link int) (bool, error) {
	if link >= 4 {
		return false, errors.New("invalid argument")
	}
	return true, nil
}
func (g fakeGPU) NVLinkRemoteBusID(int) (string, error) {
	return fmt.Sprintf("00000000:%d8:00.0", 1-g), nil
}

// noDriver is an NVML that cannot be loaded.
type noDriver struct{}

func (noDriver) Init() (nvml.Session, error) { return nil, nvml.ErrLibraryNotFound }

// env is a lookupEnv over the pairs key, value, ...
func env(pairs ...string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for i := 0; i+1 < len(pairs); i += 2 {
			if pairs[i] == k {
				return pairs[i+1], true
			}
		}
		return "", false
	}
}

// wantLines fails t for each of want that got lacks.
func wantLines(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("want %q in:\n%s", w, got)
		}
	}
}

func TestGPUSection(t *testing.T) {
	var b strings.Builder
	writeGPUs(&report{w: &b}, twoGPUs{}, env())
	wantLines(t, b.String(),
		"driver 550.54.15, CUDA driver API 12.4\n",
		"GPU0  NVIDIA H100 80GB HBM3  81559 MiB  GPU-0000  bus 00000000:08:00.0\n",
		"GPU1  NVIDIA H100 80GB HBM3  81559 MiB  GPU-1000  bus 00000000:18:00.0\n",
		"--nproc-per-node gpu and auto give 2\n",
		"GPU0  X     NV4\n",
	)

	b.Reset()
	writeGPUs(&report{w: &b}, twoGPUs{}, env("CUDA_VISIBLE_DEVICES", "GPU-1"))
	wantLines(t, b.String(), `CUDA_VISIBLE_DEVICES="GPU-1": cuda:0 = GPU1`+"\n", "--nproc-per-node gpu and auto give 1\n")

	b.Reset()
	writeGPUs(&report{w: &b}, twoGPUs{}, env("CUDA_VISIBLE_DEVICES", "-1"))
	wantLines(t, b.String(),
		`CUDA_VISIBLE_DEVICES="-1" hides all 2 GPUs`,
		fmt.Sprintf("--nproc-per-node gpu fails here; auto gives %d (the CPUs)\n", goruntime.NumCPU()),
	)

	b.Reset()
	writeGPUs(&report{w: &b}, noDriver{}, env())
	wantLines(t, b.String(),
		"no GPU listed: "+nvml.ErrLibraryNotFound.Error()+"\n",
		fmt.Sprintf("--nproc-per-node gpu fails here; auto gives %d (the CPUs)\n", goruntime.NumCPU()),
	)
}
