package collective

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futexes on words of a shared mapping. The operations are deliberately
// not FUTEX_PRIVATE: the word lives in a file mapped by several processes,
// and the kernel must key the waiters by the page, not by our address
// space, for a wake in one process to reach a sleeper in another.

// The futex operations (linux/futex.h), which x/sys/unix does not name.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *word == old, for at most d. Spurious returns are
// fine: callers re-check the word.
func futexWait(word *atomic.Uint32, old uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	// Syscall6 rather than RawSyscall6: the scheduler may hand our P to
	// another thread while this one sleeps.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWaitOp,
		uintptr(old), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on word, in any process.
func futexWake(word *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWakeOp,
		uintptr(1<<31-1), 0, 0, 0)
}

// yieldProcessor gives the core to another runnable thread, in this
// process or another: with more ranks than cores, the peer we wait for
// may need it.
// It is a raw system call: it returns at once or once another thread has
// had the core, and the scheduler need not know either way.
func yieldProcessor() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
