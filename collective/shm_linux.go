package collective

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmDir is where POSIX shared memory lives on Linux: a tmpfs whose files
// any process of the host can map.
const shmDir = "/dev/shm"

// segment is one shared-memory file, mapped.
type segment struct {
	path string // while it is still linked; "" once unlinked
	mem  []byte
}

// createSegment makes a new file of size bytes under shmDir and maps it.
// The pages are allocated now: on a full tmpfs a write to a merely
// truncated file would kill the process with SIGBUS later, mid-collective.
func createSegment(name string, size int) (*segment, error) {
	path := filepath.Join(shmDir, name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("collective: create shared memory %s: %w", path, err)
	}
	defer unix.Close(fd)
	s := &segment{path: path}
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		s.unlink()
		return nil, fmt.Errorf("collective: reserve %d bytes of shared memory in %s: %w", size, shmDir, err)
	}
	if s.mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		s.unlink()
		return nil, fmt.Errorf("collective: map %s: %w", path, err)
	}
	return s, nil
}

// openSegment maps a peer's segment, which must be size bytes.
func openSegment(name string, size int) (*segment, error) {
	path := filepath.Join(shmDir, name)
	// Never through a link, and only a plain file of this user: the name
	// came from the store.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("collective: open shared memory %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("collective: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("collective: shared memory %s is not a plain file of this user", path)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("collective: shared memory %s has %d bytes, want %d", path, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("collective: map %s: %w", path, err)
	}
	return &segment{mem: mem}, nil
}

// unlink removes the file; the mappings stay valid until unmapped, and
// the memory is freed once the last is.
func (s *segment) unlink() {
	if s.path != "" {
		os.Remove(s.path)
		s.path = ""
	}
}

func (s *segment) unmap() {
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
}

// cpusOf counts the cores that processes pids may run on together, the
// union of their affinity masks (gorun --bind-to, taskset, a cgroup's
// cpuset), and says whether each process has cores of its own (the masks
// are disjoint; a pid listed twice shares its own); 0 and false when a
// mask cannot be read.
func cpusOf(pids []int) (cpus int, apart bool) {
	var all unix.CPUSet
	apart = true
	for _, pid := range pids {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			return 0, false
		}
		for i := range set {
			apart = apart && all[i]&set[i] == 0
			all[i] |= set[i]
		}
	}
	return all.Count(), apart
}

// readPeer copies len(dst) bytes at address addr of process pid into dst
// with process_vm_readv: one copy, by the kernel, from the peer's memory
// straight into ours. The kernel allows it between processes of one user
// unless a security module forbids it (Yama's ptrace_scope, seccomp);
// setupShm tries it before any collective relies on it.
func readPeer(pid int, addr uintptr, dst []byte) error {
	return crossCopy(unix.SYS_PROCESS_VM_READV, "process_vm_readv", pid, addr, dst)
}

// writePeer copies src to address addr of process pid with
// process_vm_writev, which the kernel allows where it allows readPeer.
func writePeer(pid int, addr uintptr, src []byte) error {
	return crossCopy(unix.SYS_PROCESS_VM_WRITEV, "process_vm_writev", pid, addr, src)
}

// crossCopy moves len(local) bytes between local and address addr of
// process pid, in the direction of trap (process_vm_readv or _writev).
func crossCopy(trap uintptr, name string, pid int, addr uintptr, local []byte) error {
	for len(local) > 0 {
		liov := [1]unix.Iovec{{Base: &local[0]}}
		liov[0].SetLen(len(local))
		riov := [1]unix.RemoteIovec{{Base: addr, Len: len(local)}}
		// Raw, like the socket calls (sockio_linux.go): it cannot block,
		// and a plain system call this long has the runtime hand our
		// processor to another thread while it copies.
		r, _, errno := unix.RawSyscall6(trap, uintptr(pid),
			uintptr(unsafe.Pointer(&liov[0])), 1, uintptr(unsafe.Pointer(&riov[0])), 1, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("%s with pid %d: %w", name, pid, errno)
		}
		n := int(r)
		if n == 0 {
			return fmt.Errorf("%s with pid %d: no bytes copied", name, pid)
		}
		local, addr = local[n:], addr+uintptr(n)
	}
	return nil
}
