//go:build !cgo

package nvml

// New returns a stand-in for NVML in a binary built without cgo, where
// go-nvml cannot be compiled in: its Init always fails with ErrNoCgo.
func New() Library { return noCgo{} }

type noCgo struct{}

func (noCgo) Init() (Session, error) { return nil, ErrNoCgo }
