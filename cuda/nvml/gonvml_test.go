//go:build cgo

package nvml

import (
	"errors"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gorun/gorun/internal/testenv"
)

// TestNewOnThisHost runs the real go-nvml. Without a driver, Init must fail
// with one clear error and the process must live on (go-nvml aborts it if
// anything is called after that), and the test is skipped, under CI=true
// too (CI has no GPU): the half with a GPU was not run. With a driver,
// NVML must list a GPU.
func TestNewOnThisHost(t *testing.T) {
	sys, err := Discover(New())
	if err != nil && !errors.Is(err, ErrLibraryNotFound) && !strings.HasPrefix(err.Error(), "nvml: init: ") {
		t.Fatalf("Discover on this host: %v; want ErrLibraryNotFound or an init error", err)
	}
	testenv.MayHave(t, err, "an NVIDIA GPU and its driver's NVML", "libnvidia-ml1")
	if len(sys.GPUs) < 1 {
		t.Fatalf("NVML initialised but lists no GPU: %+v", sys)
	}
	t.Logf("driver %s, CUDA %s, %d GPUs", sys.DriverVersion, CUDAVersion(sys.CUDADriverVersion), len(sys.GPUs))
}

func TestAdapterStopsAtAFailedInit(t *testing.T) {
	// The mock panics if anything but Init is called, as the real
	// library would abort.
	m := &mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_DRIVER_NOT_LOADED }}
	_, err := Discover(goLibrary{m})
	if err == nil || !strings.HasPrefix(err.Error(), "nvml: init: ") || !strings.Contains(err.Error(), "(NVML error 9)") {
		t.Errorf("Discover = %v; want the init error with NVML's code", err)
	}

	m = &mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }}
	if _, err := Discover(goLibrary{m}); !errors.Is(err, ErrLibraryNotFound) {
		t.Errorf("Discover = %v; want ErrLibraryNotFound", err)
	}
	if len(m.InitCalls()) != 1 || len(m.ShutdownCalls()) != 0 {
		t.Errorf("Init called %d times, Shutdown %d; want 1 and 0", len(m.InitCalls()), len(m.ShutdownCalls()))
	}
}

// TestAdapterReadsGoNVML runs Discover through the adapter over go-nvml's
// own mock: two GPUs joined by one NVLink.
func TestAdapterReadsGoNVML(t *testing.T) {
	pci := func(id string) gonvml.PciInfo {
		var p gonvml.PciInfo
		for i, c := range []byte(id) {
			p.BusId[i] = int8(c)
		}
		return p
	}
	newDevice := func(uuid, bus, peerBus string) *mock.Device {
		return &mock.Device{
			GetNameFunc:       func() (string, gonvml.Return) { return "NVIDIA A100-SXM4-40GB", gonvml.SUCCESS },
			GetUUIDFunc:       func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
			GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{Total: 40 << 30}, gonvml.SUCCESS },
			GetPciInfoFunc:    func() (gonvml.PciInfo, gonvml.Return) { return pci(bus), gonvml.SUCCESS },
			GetTopologyCommonAncestorFunc: func(gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
				return gonvml.TOPOLOGY_HOSTBRIDGE, gonvml.SUCCESS
			},
			GetP2PStatusFunc: func(_ gonvml.Device, c gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
				if c == gonvml.P2P_CAPS_INDEX_WRITE {
					return gonvml.P2P_STATUS_NOT_SUPPORTED, gonvml.SUCCESS
				}
				return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
			},
			GetNvLinkStateFunc: func(link int) (gonvml.EnableState, gonvml.Return) {
				if link > 0 {
					return gonvml.FEATURE_DISABLED, gonvml.ERROR_INVALID_ARGUMENT
				}
				return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
			},
			GetNvLinkRemotePciInfoFunc: func(int) (gonvml.PciInfo, gonvml.Return) { return pci(peerBus), gonvml.SUCCESS },
		}
	}
	devices := []gonvml.Device{
		newDevice("GPU-0000", "00000000:07:00.0", "0000:0f:00.0"),
		newDevice("GPU-1111", "00000000:0F:00.0", "0000:07:00.0"),
	}
	m := &mock.Interface{
		InitFunc:                       func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return "535.104.05", gonvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return 12020, gonvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, gonvml.Return) { return len(devices), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc:     func(i int) (gonvml.Device, gonvml.Return) { return devices[i], gonvml.SUCCESS },
	}

	sys, err := Discover(goLibrary{m})
	if err != nil || sys.Partial != nil {
		t.Fatalf("Discover: %v (partial: %v)", err, sys.Partial)
	}
	if sys.DriverVersion != "535.104.05" || sys.CUDADriverVersion != 12020 {
		t.Errorf("driver %q CUDA %d", sys.DriverVersion, sys.CUDADriverVersion)
	}
	g := sys.GPUs[1]
	if g.Name != "NVIDIA A100-SXM4-40GB" || g.UUID != "GPU-1111" || g.BusID != "00000000:0F:00.0" || g.MemoryTotal != 40<<30 {
		t.Errorf("GPU1 = %+v", g)
	}
	want := Link{Level: LevelHostBridge, NVLinks: 1, Read: P2POK, Write: P2PNotSupported}
	if sys.Links[0][1] != want || sys.Links[1][0] != want {
		t.Errorf("links = %+v; want %+v both ways", sys.Links, want)
	}
	// The pair queries got go-nvml's own handle of the peer, not ours.
	peer := devices[0].(*mock.Device).GetP2PStatusCalls()[0].Device
	if peer != devices[1] {
		t.Errorf("GetP2PStatus got peer %T %p; want go-nvml's device %p", peer, peer, devices[1])
	}
	if len(m.ShutdownCalls()) != 1 {
		t.Errorf("Shutdown called %d times; want 1", len(m.ShutdownCalls()))
	}
}
