package cuda

import (
	"context"
	"fmt"
	"math"
	"unsafe"
)

// ncclResult is NCCL's ncclResult_t.
type ncclResult int32

// The ncclResult_t values.
const (
	ncclSuccess            ncclResult = 0
	ncclUnhandledCudaError ncclResult = 1
	ncclSystemError        ncclResult = 2
	ncclInternalError      ncclResult = 3
	ncclInvalidArgument    ncclResult = 4
	ncclInvalidUsage       ncclResult = 5
	ncclRemoteError        ncclResult = 6
	ncclInProgress         ncclResult = 7
)

func (r ncclResult) name() string {
	switch r {
	case ncclSuccess:
		return "ncclSuccess"
	case ncclUnhandledCudaError:
		return "ncclUnhandledCudaError"
	case ncclSystemError:
		return "ncclSystemError"
	case ncclInternalError:
		return "ncclInternalError"
	case ncclInvalidArgument:
		return "ncclInvalidArgument"
	case ncclInvalidUsage:
		return "ncclInvalidUsage"
	case ncclRemoteError:
		return "ncclRemoteError"
	case ncclInProgress:
		return "ncclInProgress"
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// uniqueID is ncclUniqueId: 128 opaque bytes that ncclCommInitRank takes
// by value.
type uniqueID struct{ internal [128]byte }

// ncclConfig is the prefix of ncclConfig_t that NCCL 2.18 defined. NCCL
// reads min(size, its own sizeof) bytes and gives fields newer than
// version their defaults, so this layout works with every NCCL that has
// ncclCommInitRankConfig (2.14 on).
type ncclConfig struct {
	size           uintptr
	magic          uint32
	version        uint32
	blocking       int32
	cgaClusterSize int32
	minCTAs        int32
	maxCTAs        int32
	_              *byte // netName: NULL, NCCL chooses the network
	splitShare     int32
	_              int32 // C's tail padding
}

// newConfig is NCCL_CONFIG_INITIALIZER with blocking set.
func newConfig(blocking bool) *ncclConfig {
	const undef = math.MinInt32 // NCCL_CONFIG_UNDEF_INT: "use the default"
	c := &ncclConfig{
		size:           unsafe.Sizeof(ncclConfig{}),
		magic:          0xcafebeef,
		version:        21800, // NCCL_VERSION(2,18,0): the layout above
		cgaClusterSize: undef,
		minCTAs:        undef,
		maxCTAs:        undef,
		splitShare:     undef,
	}
	if blocking {
		c.blocking = 1
	}
	return c
}

// splitNoColor is NCCL_SPLIT_NOCOLOR: the rank joins no new communicator.
const splitNoColor = -1

// ncclAPI holds the NCCL functions we call, named as in nccl.h. Pointers
// (communicators, streams, buffers) travel as uintptr; enums as int32.
type ncclAPI struct {
	ncclGetVersion         func(version *int32) ncclResult
	ncclGetErrorString     func(res ncclResult) string
	ncclGetUniqueId        func(id *uniqueID) ncclResult
	ncclCommInitRank       func(comm *uintptr, nranks int32, id uniqueID, rank int32) ncclResult
	ncclCommAbort          func(comm uintptr) ncclResult
	ncclCommDestroy        func(comm uintptr) ncclResult
	ncclCommGetAsyncError  func(comm uintptr, state *ncclResult) ncclResult
	ncclAllReduce          func(send, recv DevicePtr, count uintptr, dt, op int32, comm uintptr, s stream) ncclResult
	ncclBroadcast          func(send, recv DevicePtr, count uintptr, dt, root int32, comm uintptr, s stream) ncclResult
	ncclReduce             func(send, recv DevicePtr, count uintptr, dt, op, root int32, comm uintptr, s stream) ncclResult
	ncclAllGather          func(send, recv DevicePtr, sendCount uintptr, dt int32, comm uintptr, s stream) ncclResult
	ncclReduceScatter      func(send, recv DevicePtr, recvCount uintptr, dt, op int32, comm uintptr, s stream) ncclResult
	ncclSend               func(send DevicePtr, count uintptr, dt, peer int32, comm uintptr, s stream) ncclResult
	ncclRecv               func(recv DevicePtr, count uintptr, dt, peer int32, comm uintptr, s stream) ncclResult
	ncclGroupStart         func() ncclResult
	ncclGroupEnd           func() ncclResult
	ncclGetLastError       func(comm uintptr) string                                                            // 2.13
	ncclCommInitRankConfig func(comm *uintptr, nranks int32, id uniqueID, rank int32, c *ncclConfig) ncclResult // 2.14
	ncclCommFinalize       func(comm uintptr) ncclResult                                                        // 2.14
	ncclCommSplit          func(comm uintptr, color, key int32, newComm *uintptr, c *ncclConfig) ncclResult     // 2.18
}

func (a *ncclAPI) symbols() []symbol {
	return []symbol{
		{name: "ncclGetErrorString", fn: &a.ncclGetErrorString},
		{name: "ncclGetUniqueId", fn: &a.ncclGetUniqueId},
		{name: "ncclCommInitRank", fn: &a.ncclCommInitRank},
		{name: "ncclCommAbort", fn: &a.ncclCommAbort},
		{name: "ncclCommDestroy", fn: &a.ncclCommDestroy},
		{name: "ncclCommGetAsyncError", fn: &a.ncclCommGetAsyncError},
		{name: "ncclAllReduce", fn: &a.ncclAllReduce},
		{name: "ncclBroadcast", fn: &a.ncclBroadcast},
		{name: "ncclReduce", fn: &a.ncclReduce},
		{name: "ncclAllGather", fn: &a.ncclAllGather},
		{name: "ncclReduceScatter", fn: &a.ncclReduceScatter},
		{name: "ncclSend", fn: &a.ncclSend},
		{name: "ncclRecv", fn: &a.ncclRecv},
		{name: "ncclGroupStart", fn: &a.ncclGroupStart},
		{name: "ncclGroupEnd", fn: &a.ncclGroupEnd},
		{name: "ncclGetLastError", fn: &a.ncclGetLastError, optional: true},
		{name: "ncclCommInitRankConfig", fn: &a.ncclCommInitRankConfig, optional: true},
		{name: "ncclCommFinalize", fn: &a.ncclCommFinalize, optional: true},
		{name: "ncclCommSplit", fn: &a.ncclCommSplit, optional: true},
	}
}

// Version is a library version.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// ncclVersionOf decodes ncclGetVersion's code: X*10000+Y*100+Z since NCCL
// 2.9, X*1000+Y*100+Z before.
func ncclVersionOf(code int) Version {
	if code >= 10000 {
		return Version{code / 10000, code / 100 % 100, code % 100}
	}
	return Version{code / 1000, code / 100 % 10, code % 100}
}

// minNCCL is the oldest NCCL we use: the first with ncclSend/ncclRecv.
var minNCCL = Version{2, 7, 0}

// The NCCL versions that brought features we use when present.
var (
	ncclAvgAndBF16 = Version{2, 10, 0} // ncclAvg, ncclBfloat16
)

// VersionError says a library is older than we need.
type VersionError struct {
	Library string
	Found   Version
	Min     Version
	Why     string // what the minimum brings
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("%s %v is too old: gorun needs %v or newer (%s)", e.Library, e.Found, e.Min, e.Why)
}

// NCCL is libnccl.so.2, loaded. It is safe for concurrent use; the
// communicators it makes are its working part.
type NCCL struct {
	path    string
	api     ncclAPI
	version Version
	lib     uintptr // the dlopen handle, which the tests use to reach a fake NCCL's own functions
}

// LoadNCCL finds libnccl.so.2 as s says, checks its version and binds its
// functions. No GPU is touched. A library that is missing, older than
// 2.7 or lacks a required function is a *LoadError, which unwraps to a
// *VersionError or *SymbolsError for the copies found.
func LoadNCCL(ctx context.Context, s Search) (*NCCL, error) {
	n := &NCCL{}
	lib, path, err := s.load(ctx, ncclLibrary, func(h uintptr) error {
		api, version, err := checkNCCL(h)
		if err != nil {
			return err
		}
		n.api, n.version = api, version
		return nil
	})
	if err != nil {
		return nil, err
	}
	n.lib, n.path = lib, path
	return n, nil
}

// Path is the file NCCL was loaded from, or its soname when the dynamic
// loader found it.
func (n *NCCL) Path() string { return n.path }

// Version is the loaded NCCL's version.
func (n *NCCL) Version() Version { return n.version }

// CanSplit reports whether Comm.Split uses ncclCommSplit (NCCL 2.18);
// otherwise it builds the new communicator from a fresh unique id.
func (n *NCCL) CanSplit() bool { return n.api.ncclCommSplit != nil }

// Nonblocking reports whether communicators are created non-blocking
// (NCCL 2.14), which lets a timeout abort any call. With an older NCCL a
// call that blocks inside NCCL (init, a collective whose peer is gone) can
// only be abandoned, not interrupted.
func (n *NCCL) Nonblocking() bool { return n.api.ncclCommInitRankConfig != nil }

// NCCLError is a failed NCCL call, with NCCL's own words for it.
type NCCLError struct {
	Call string // e.g. "ncclAllReduce"
	Code int    // the ncclResult_t
	Name string // e.g. "ncclInvalidArgument"
	Text string // ncclGetErrorString's
	Last string // ncclGetLastError's detail, when the library has it
}

func (e *NCCLError) Error() string {
	msg := fmt.Sprintf("%s: %s: %s", e.Call, e.Name, e.Text)
	if e.Last != "" {
		msg += ": " + e.Last
	}
	return msg
}

// ncclError describes res, the failure of call on comm (0 for none).
func (n *NCCL) ncclError(call string, res ncclResult, comm uintptr) *NCCLError {
	e := &NCCLError{Call: call, Code: int(res), Name: res.name(), Text: n.api.ncclGetErrorString(res)}
	if n.api.ncclGetLastError != nil {
		e.Last = n.api.ncclGetLastError(comm)
	}
	return e
}
