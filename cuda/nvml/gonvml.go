//go:build cgo

package nvml

import (
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// New returns this host's NVML through go-nvml, which loads
// libnvidia-ml.so.1 when Init is called. go-nvml binds NVML's symbols
// lazily, so the binary starts without the library; it must not be linked
// with -z now (BIND_NOW), or it aborts at start on a host without a driver.
func New() Library { return goLibrary{gonvml.New()} }

// goLibrary adapts go-nvml to Library, converting its Return codes to
// errors and its constants to ours, which share NVML's values.
type goLibrary struct{ lib gonvml.Interface }

func (l goLibrary) Init() (Session, error) {
	switch ret := l.lib.Init(); ret {
	case gonvml.SUCCESS:
		return goSession(l), nil
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, ErrLibraryNotFound
	default:
		// ret.Error() is NVML's own nvmlErrorString once the library is
		// loaded, which NVML allows before a successful init.
		return nil, fmt.Errorf("nvml: init: %s (NVML error %d)", ret.Error(), int(ret))
	}
}

type goSession struct{ lib gonvml.Interface }

func (s goSession) DriverVersion() (string, error) {
	v, ret := s.lib.SystemGetDriverVersion()
	return v, check(ret)
}

func (s goSession) CUDADriverVersion() (int, error) {
	v, ret := s.lib.SystemGetCudaDriverVersion()
	return v, check(ret)
}

func (s goSession) DeviceCount() (int, error) {
	n, ret := s.lib.DeviceGetCount()
	return n, check(ret)
}

func (s goSession) Device(i int) (Device, error) {
	d, ret := s.lib.DeviceGetHandleByIndex(i)
	if err := check(ret); err != nil {
		return nil, err
	}
	return goDevice{d}, nil
}

func (s goSession) Shutdown() error { return check(s.lib.Shutdown()) }

type goDevice struct{ d gonvml.Device }

func (d goDevice) Name() (string, error) {
	v, ret := d.d.GetName()
	return v, check(ret)
}

func (d goDevice) UUID() (string, error) {
	v, ret := d.d.GetUUID()
	return v, check(ret)
}

func (d goDevice) MemoryTotal() (uint64, error) {
	m, ret := d.d.GetMemoryInfo()
	return m.Total, check(ret)
}

func (d goDevice) BusID() (string, error) {
	p, ret := d.d.GetPciInfo()
	return busID(p), check(ret)
}

func (d goDevice) CommonAncestor(peer Device) (Level, error) {
	p, err := unwrap(peer)
	if err != nil {
		return LevelUnknown, err
	}
	l, ret := d.d.GetTopologyCommonAncestor(p)
	return Level(l), check(ret)
}

func (d goDevice) P2PStatus(peer Device, c P2PCap) (P2PStatus, error) {
	p, err := unwrap(peer)
	if err != nil {
		return P2PUnknown, err
	}
	s, ret := d.d.GetP2PStatus(p, gonvml.GpuP2PCapsIndex(c))
	return P2PStatus(s), check(ret)
}

func (d goDevice) NVLinkActive(link int) (bool, error) {
	s, ret := d.d.GetNvLinkState(link)
	return s == gonvml.FEATURE_ENABLED, check(ret)
}

func (d goDevice) NVLinkRemoteBusID(link int) (string, error) {
	p, ret := d.d.GetNvLinkRemotePciInfo(link)
	return busID(p), check(ret)
}

// unwrap returns go-nvml's handle behind peer, which NVML's pair queries
// need.
func unwrap(peer Device) (gonvml.Device, error) {
	p, ok := peer.(goDevice)
	if !ok {
		return nil, fmt.Errorf("nvml: peer %T is not a go-nvml device", peer)
	}
	return p.d, nil
}

// busID reads the NUL-terminated bus id NVML writes into PciInfo.
func busID(p gonvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func check(ret gonvml.Return) error {
	if ret == gonvml.SUCCESS {
		return nil
	}
	return errors.New(ret.Error())
}
