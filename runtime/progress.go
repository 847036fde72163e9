package runtime

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/workerenv"
)

// ProgressFileEnv names the file through which the launcher watches the
// worker's progress (gorun --hang-timeout). The runtime counts in it, as
// an 8-byte unsigned integer in the host's byte order, every operation
// that completes without error: once when Init has joined the job, then
// once per collective, point-to-point message and monitored barrier. A
// launcher that sees the count stand still for too long takes the worker
// group for hung. After the counter, the file holds the flight recorder
// (see flight.go): the worker's last operations.
const ProgressFileEnv = workerenv.ProgressFile

// progressSize is the counter's size in the file.
const progressSize = 8

// progress is the counter of ProgressFileEnv, mapped into memory so that
// counting costs one atomic add and no system call. A nil *progress
// counts nothing: without the variable, progress costs nothing.
type progress struct {
	mem     []byte
	counter *atomic.Uint64
}

// openProgress maps the counter in the file at path, growing the file to
// the counter's size if it is shorter.
func openProgress(path string) (*progress, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("runtime: %s: %w", ProgressFileEnv, err)
	}
	defer f.Close() // the mapping outlives the descriptor
	info, err := f.Stat()
	if err == nil && info.Size() < progressFileSize {
		err = f.Truncate(progressFileSize)
	}
	if err != nil {
		return nil, fmt.Errorf("runtime: %s: %w", ProgressFileEnv, err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, progressFileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("runtime: %s: map %s: %w", ProgressFileEnv, path, err)
	}
	// The mapping starts on a page boundary, which suits a 64-bit atomic.
	p := &progress{mem: mem, counter: (*atomic.Uint64)(unsafe.Pointer(&mem[0]))}
	p.initFlight()
	return p, nil
}

// add counts one completed operation.
func (p *progress) add() {
	if p != nil {
		p.counter.Add(1)
	}
}

// close unmaps the counter; nothing may count afterwards.
func (p *progress) close() error {
	if p == nil {
		return nil
	}
	p.counter = nil
	return unix.Munmap(p.mem)
}

// openProgress opens the counter the launcher named, adding its release
// to release; without the variable, or when the file cannot be mapped
// (which only blinds the launcher's hang detection, so it is logged, not
// fatal), it returns nil.
func (c *config) openProgress(log zerolog.Logger, release *cleanups) *progress {
	path, ok := c.lookupEnv(ProgressFileEnv)
	if !ok || path == "" {
		return nil
	}
	p, err := openProgress(path)
	if err != nil {
		log.Warn().Err(err).Msg("the launcher will not see this worker's progress")
		return nil
	}
	release.add(p.close)
	return p
}
