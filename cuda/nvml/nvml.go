// Package nvml finds this node's GPUs through NVIDIA's management library
// (NVML): what they are, how they are connected, and how many of them a
// CUDA process may use under CUDA_VISIBLE_DEVICES.
//
// It is for the launcher only. The real library is reached through go-nvml,
// which needs cgo, and workers must stay free of cgo: the worker runtime
// never imports this package.
//
// NVML is asked only through Library, Session and Device, so tests replace
// it with a fake. The real one is New (go-nvml), or, in a binary built
// without cgo, a stand-in whose Init always fails.
package nvml

import (
	"errors"
	"fmt"
)

// Errors of Library.Init that callers may match with errors.Is.
var (
	// ErrLibraryNotFound means libnvidia-ml.so.1 could not be loaded: no
	// NVIDIA driver here, or its library is not on the loader's path.
	ErrLibraryNotFound = errors.New("nvml: libnvidia-ml.so.1 not found (no NVIDIA driver installed, or its library is not on the loader path)")
	// ErrNoCgo means this binary was built with CGO_ENABLED=0, without
	// which go-nvml cannot be compiled in.
	ErrNoCgo = errors.New("nvml: built without cgo: NVML unavailable")
)

// Library is NVML before it is initialised.
type Library interface {
	// Init initialises NVML. The Session it returns is the only way to ask
	// NVML anything, so that nothing can be called after a failed Init:
	// with go-nvml, a call into a library that failed to load aborts the
	// whole process with a symbol lookup error.
	Init() (Session, error)
}

// Session is an initialised NVML, released by Shutdown.
type Session interface {
	DriverVersion() (string, error)
	// CUDADriverVersion is the CUDA version the driver supports, as
	// 1000*major + 10*minor (12040 is 12.4).
	CUDADriverVersion() (int, error)
	DeviceCount() (int, error)
	// Device returns the device with NVML's index i (PCI bus order).
	Device(i int) (Device, error)
	Shutdown() error
}

// Device is one GPU as NVML sees it. Peers passed to its methods come from
// the same Session.
type Device interface {
	Name() (string, error)
	UUID() (string, error)
	MemoryTotal() (uint64, error)
	// BusID is the PCI address, as NVML writes it: "00000000:18:00.0".
	BusID() (string, error)
	CommonAncestor(peer Device) (Level, error)
	P2PStatus(peer Device, c P2PCap) (P2PStatus, error)
	// NVLinkActive reports whether link is up; past the device's last link,
	// or on a GPU without NVLink, it returns an error.
	NVLinkActive(link int) (bool, error)
	// NVLinkRemoteBusID is the PCI address at the other end of link: a
	// peer GPU, or an NVSwitch.
	NVLinkRemoteBusID(link int) (string, error)
}

// MaxNVLinks bounds the links asked about per device (NVML_NVLINK_MAX_LINKS).
const MaxNVLinks = 36

// System is what NVML says about this node.
type System struct {
	DriverVersion     string
	CUDADriverVersion int // 1000*major + 10*minor; 0 when unknown
	GPUs              []GPU
	// Links[i][j] is how GPUs[i] reaches GPUs[j]; nil with fewer than two
	// GPUs.
	Links [][]Link
	// Partial holds what NVML could not tell; everything else in System is
	// still right.
	Partial error
}

// GPU is one device, identified by NVML's index.
type GPU struct {
	Index       int
	Name        string
	UUID        string
	BusID       string
	MemoryTotal uint64 // bytes
}

// CUDAVersion formats a CUDA version number (12040) as CUDA does ("12.4").
func CUDAVersion(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// Discover initialises lib and reports the devices, their driver and how
// they are connected. When Init fails, its error is returned and nothing
// else is called. Failing to count the devices or to reach one fails
// Discover; anything NVML cannot say about a device it reaches goes to
// System.Partial.
func Discover(lib Library) (sys *System, err error) {
	s, err := lib.Init()
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := s.Shutdown(); serr != nil {
			err = errors.Join(err, fmt.Errorf("nvml: shutdown: %w", serr))
		}
	}()

	sys = &System{}
	var partial []error
	note := func(what string, err error) {
		if err != nil {
			partial = append(partial, fmt.Errorf("%s: %w", what, err))
		}
	}
	sys.DriverVersion, err = s.DriverVersion()
	note("driver version", err)
	sys.CUDADriverVersion, err = s.CUDADriverVersion()
	note("CUDA driver version", err)

	n, err := s.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("nvml: count devices: %w", err)
	}
	devices := make([]Device, n)
	sys.GPUs = make([]GPU, n)
	for i := range devices {
		d, err := s.Device(i)
		if err != nil {
			return nil, fmt.Errorf("nvml: device %d of %d: %w", i, n, err)
		}
		devices[i] = d
		g := &sys.GPUs[i]
		g.Index = i
		g.Name, err = d.Name()
		note(fmt.Sprintf("GPU%d name", i), err)
		g.UUID, err = d.UUID()
		note(fmt.Sprintf("GPU%d UUID", i), err)
		g.BusID, err = d.BusID()
		note(fmt.Sprintf("GPU%d PCI bus id", i), err)
		g.MemoryTotal, err = d.MemoryTotal()
		note(fmt.Sprintf("GPU%d memory", i), err)
	}
	sys.Links = links(devices, sys.GPUs)
	sys.Partial = errors.Join(partial...)
	return sys, nil
}
