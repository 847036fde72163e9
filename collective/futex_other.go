//go:build !linux

package collective

import (
	"sync/atomic"
	"time"
)

// Without futexes (no shared-memory transport is built here; see
// shm_other.go) waiting degrades to short sleeps.

func futexWait(word *atomic.Uint32, old uint32, d time.Duration) {
	time.Sleep(min(d, 50*time.Microsecond))
}

func futexWake(*atomic.Uint32) {}

func yieldProcessor() {}
