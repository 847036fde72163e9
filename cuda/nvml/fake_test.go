package nvml

import (
	"errors"
	"fmt"
)

// fakeLibrary is an NVML in memory that logs every call, so that tests see
// what was asked and in which order.
type fakeLibrary struct {
	initErr error
	gpus    []fakeGPU
	// level, p2p and nvlinkP2P answer the pair queries; absent pairs fail
	// with errNotSupported.
	level     map[[2]int]Level
	p2p       map[[2]int]P2PStatus
	nvlinkP2P map[[2]int]bool
	calls     []string
}

type fakeGPU struct {
	name, uuid, bus string
	memory          uint64
	nameErr         error
	// links holds the far end's bus id of each NVLink; "" is a link that
	// is down. No links: NVML answers errNotSupported for link 0.
	links []string
}

var errNotSupported = errors.New("not supported")

func (f *fakeLibrary) log(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeLibrary) Init() (Session, error) {
	f.log("Init")
	if f.initErr != nil {
		return nil, f.initErr
	}
	return fakeSession{f}, nil
}

type fakeSession struct{ f *fakeLibrary }

func (s fakeSession) DriverVersion() (string, error) {
	s.f.log("DriverVersion")
	return "550.54.15", nil
}

func (s fakeSession) CUDADriverVersion() (int, error) {
	s.f.log("CUDADriverVersion")
	return 12040, nil
}

func (s fakeSession) DeviceCount() (int, error) {
	s.f.log("DeviceCount")
	return len(s.f.gpus), nil
}

func (s fakeSession) Device(i int) (Device, error) {
	s.f.log("Device %d", i)
	if i < 0 || i >= len(s.f.gpus) {
		return nil, errors.New("invalid argument")
	}
	return fakeDevice{s.f, i}, nil
}

func (s fakeSession) Shutdown() error {
	s.f.log("Shutdown")
	return nil
}

type fakeDevice struct {
	f *fakeLibrary
	i int
}

func (d fakeDevice) gpu() fakeGPU { return d.f.gpus[d.i] }

func (d fakeDevice) Name() (string, error) {
	d.f.log("Name %d", d.i)
	if err := d.gpu().nameErr; err != nil {
		return "", err
	}
	return d.gpu().name, nil
}

func (d fakeDevice) UUID() (string, error) {
	d.f.log("UUID %d", d.i)
	return d.gpu().uuid, nil
}

func (d fakeDevice) MemoryTotal() (uint64, error) {
	d.f.log("MemoryTotal %d", d.i)
	return d.gpu().memory, nil
}

func (d fakeDevice) BusID() (string, error) {
	d.f.log("BusID %d", d.i)
	return d.gpu().bus, nil
}

func (d fakeDevice) CommonAncestor(peer Device) (Level, error) {
	j := peer.(fakeDevice).i
	d.f.log("CommonAncestor %d %d", d.i, j)
	if l, ok := d.f.level[[2]int{d.i, j}]; ok {
		return l, nil
	}
	return LevelUnknown, errNotSupported
}

func (d fakeDevice) P2PStatus(peer Device, c P2PCap) (P2PStatus, error) {
	j := peer.(fakeDevice).i
	d.f.log("P2PStatus %d %d %d", d.i, j, c)
	if c == P2PNVLink {
		if d.f.nvlinkP2P[[2]int{d.i, j}] {
			return P2POK, nil
		}
		return P2PNotSupported, nil
	}
	if s, ok := d.f.p2p[[2]int{d.i, j}]; ok {
		return s, nil
	}
	return P2PUnknown, errNotSupported
}

func (d fakeDevice) NVLinkActive(link int) (bool, error) {
	d.f.log("NVLinkActive %d %d", d.i, link)
	links := d.gpu().links
	if link >= len(links) {
		if link == 0 {
			return false, errNotSupported
		}
		return false, errors.New("invalid argument")
	}
	return links[link] != "", nil
}

func (d fakeDevice) NVLinkRemoteBusID(link int) (string, error) {
	d.f.log("NVLinkRemoteBusID %d %d", d.i, link)
	return d.gpu().links[link], nil
}
