package launcher

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// JobMarkEnv carries a job's mark to every worker, and so to everything a
// worker starts that keeps its environment, when the workers are contained
// by the subreaper (no cgroup): the keeper finds the job's processes by it
// after the agent is gone.
const JobMarkEnv = "GORUN_JOB_MARK"

// proc is what a /proc scan tells about one process.
type proc struct {
	pid, ppid, pgid int
	zombie          bool // dead, waiting to be reaped: nothing to kill
	marked          bool // its environment holds the job's mark
}

// leftovers picks, from a scan of every process, those to kill once no
// worker runs: the job's marked processes, the children of self that self
// did not start (started reports those it did) and that are not in self's
// own process group, which a subreaper adopted from its workers' dead
// descendants; and every descendant of those. Zombies are already dead, and
// self and what it started are never picked.
func leftovers(procs []proc, self, selfPgid int, started func(pid int) bool) []int {
	children := make(map[int][]int)
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	mine := func(p proc) bool { return p.pid == self || started(p.pid) }
	picked := make(map[int]bool)
	var queue []int
	for _, p := range procs {
		adopted := p.ppid == self && p.pgid != selfPgid
		if (p.marked || adopted) && !mine(p) && !picked[p.pid] {
			picked[p.pid] = true
			queue = append(queue, p.pid)
		}
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, child := range children[pid] {
			if !picked[child] && child != self && !started(child) {
				picked[child] = true
				queue = append(queue, child)
			}
		}
	}
	var pids []int
	for _, p := range procs {
		if picked[p.pid] && !p.zombie {
			pids = append(pids, p.pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// scanProcs reads every process in /proc. With a mark, it reads the
// environment of the processes of uid (of every process when uid is root's)
// for it; a process it may not read is not marked.
func scanProcs(mark string, uid int) []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var procs []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		p, ok := readProc(pid)
		if !ok {
			continue // gone since the listing
		}
		if mark != "" && !p.zombie && (uid == 0 || ownedBy(pid, uid)) {
			environ, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			p.marked = err == nil && hasMark(environ, mark)
		}
		procs = append(procs, p)
	}
	return procs
}

// readProc parses the parent, process group and state of pid from its stat.
func readProc(pid int) (proc, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return proc{}, false
	}
	// The command name, in parentheses, may hold anything; the fields
	// after its last ')' are: state ppid pgrp ...
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return proc{}, false
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 3 {
		return proc{}, false
	}
	ppid, err1 := strconv.Atoi(fields[1])
	pgid, err2 := strconv.Atoi(fields[2])
	if err1 != nil || err2 != nil {
		return proc{}, false
	}
	return proc{pid: pid, ppid: ppid, pgid: pgid, zombie: fields[0] == "Z" || fields[0] == "X"}, true
}

// ownedBy reports whether pid runs as uid: /proc/<pid> belongs to the
// process's effective user.
func ownedBy(pid, uid int) bool {
	var st unix.Stat_t
	return unix.Stat("/proc/"+strconv.Itoa(pid), &st) == nil && int(st.Uid) == uid
}

// hasMark reports whether a NUL-separated environment holds exactly
// JobMarkEnv=mark.
func hasMark(environ []byte, mark string) bool {
	want := []byte(JobMarkEnv + "=" + mark)
	for entry := range bytes.SplitSeq(environ, []byte{0}) {
		if bytes.Equal(entry, want) {
			return true
		}
	}
	return false
}

// killLeftovers SIGKILLs what leftovers picks, scanning again until a scan
// finds nothing (what forks between a scan and its kill is found by the
// next), at most for wait; after each round, reap reaps the adopted
// processes that died. It returns the pids it killed and those still alive
// at the deadline.
//
// A process in the middle of an exec shows an empty environment for a
// moment, and so no mark: a scan that finds nothing is believed only when
// another, settle later, finds nothing either. That second look follows a
// round that killed something and, where always is set (the keeper, whose
// agent is gone), the first scan too; an agent's job that left nothing
// ends without it.
func killLeftovers(mark string, started func(int) bool, reap func(), wait, settle time.Duration, always bool) (killed, left []int) {
	self, pgid, uid := os.Getpid(), syscall.Getpgrp(), os.Getuid()
	deadline := time.Now().Add(wait)
	settled := false // the last scan found nothing, settle ago
	for {
		pids := leftovers(scanProcs(mark, uid), self, pgid, started)
		quiet := len(pids) == 0
		if quiet && !settled && (always || len(killed) > 0) && time.Now().Before(deadline) {
			settled = true
			time.Sleep(settle)
			continue
		}
		if quiet || time.Now().After(deadline) {
			// What was killed since the last reap is dead now, if adopted
			// a zombie of ours.
			reap()
			return killed, pids
		}
		settled = false
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil && !slices.Contains(killed, pid) {
				killed = append(killed, pid)
			}
		}
		reap()
		time.Sleep(cgroupPoll)
	}
}

// execSettle is how long a process's exec may hide its environment
// before a scan that found nothing is believed (see killLeftovers).
const execSettle = 100 * time.Millisecond

// reapAdopted reaps the children of this process that are dead, that it
// did not start (started), and that are not in its own process group: the
// processes a subreaper adopted. It never touches a child that os/exec
// waits for, which would lose that child's exit status.
func reapAdopted(started func(int) bool) {
	self, pgid := os.Getpid(), syscall.Getpgrp()
	for _, p := range scanProcs("", 0) {
		if p.ppid != self || !p.zombie || p.pgid == pgid || started(p.pid) {
			continue
		}
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOHANG, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}
}

// setSubreaper makes this process the reaper of its orphaned descendants,
// and reports whether it was one already.
func setSubreaper() (was bool, err error) {
	var flag int32
	if err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&flag)), 0, 0, 0); err != nil {
		return false, err
	}
	if flag != 0 {
		return true, nil
	}
	return false, unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}
