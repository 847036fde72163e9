package launcher

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// ContainMode says how a Containment holds what the workers start.
type ContainMode string

const (
	// ContainAuto uses a cgroup where this process may create one, and
	// the subreaper otherwise.
	ContainAuto ContainMode = "auto"
	// ContainCgroup starts every group of workers inside a cgroup v2 of its
	// own, below a cgroup of the job's: whatever they start, however it
	// detaches, stays inside and dies with it.
	ContainCgroup ContainMode = "cgroup"
	// ContainSubreaper makes this process the reaper of its orphaned
	// descendants and marks the workers' environment (JobMarkEnv): while
	// this process lives it finds everything the workers started; once it
	// is killed, the keeper finds what kept the mark.
	ContainSubreaper ContainMode = "subreaper"
)

// ParseContainMode parses "auto" (or ""), "cgroup" or "subreaper".
func ParseContainMode(s string) (ContainMode, error) {
	switch m := ContainMode(s); m {
	case "", ContainAuto:
		return ContainAuto, nil
	case ContainCgroup, ContainSubreaper:
		return m, nil
	}
	return "", fmt.Errorf("launcher: containment %q: want auto, cgroup or subreaper", s)
}

// ContainOptions configure Contain.
type ContainOptions struct {
	Mode   ContainMode // "" = ContainAuto
	Logger zerolog.Logger
}

// Containment holds everything the workers of one job start, so that none
// of it outlives the group that started it: when the last worker of a
// group has exited, however it ended, what it left behind is SIGKILLed
// before its Exit is delivered; the keeper it starts (StartKeeper) kills
// the rest if this process dies.
//
// In subreaper mode a Containment takes every child of this process that
// it did not start itself and that is not in this process's own process
// group for a worker's orphaned descendant: a process that holds one must
// start its other children in its own process group (exec.Command does),
// and hold no more than one.
type Containment struct {
	mode   ContainMode // resolved: cgroup or subreaper
	log    zerolog.Logger
	cgroup string // the job's cgroup, in cgroup mode
	mark   string // the job's mark, in subreaper mode

	// starts is held for reading while a child is started and recorded,
	// and for writing while children are scanned, to reap or kill them,
	// so that no scan sees a child started but not yet recorded.
	starts  sync.RWMutex
	mu      sync.Mutex
	started map[int]bool // this process's own children, until reaped
	running atomic.Int64 // workers started and not yet dead
	cells   atomic.Int64 // numbers the groups' cgroups

	wasSubreaper bool
	sigchld      chan os.Signal
	stopReaping  chan struct{}
	reaping      sync.WaitGroup
	closeOnce    sync.Once
	closeErr     error
}

// Contain sets up the containment of a job's workers. In ContainAuto mode
// it falls back to the subreaper where no cgroup can be created (not root,
// no delegated cgroup v2, an old kernel); in ContainCgroup mode that is an
// error.
func Contain(opts ContainOptions) (*Containment, error) {
	mode, err := ParseContainMode(string(opts.Mode))
	if err != nil {
		return nil, err
	}
	c := &Containment{log: opts.Logger, started: make(map[int]bool)}
	if mode != ContainSubreaper {
		dir, err := createJobCgroup()
		if err == nil {
			c.mode, c.cgroup = ContainCgroup, dir
			c.log.Debug().Str("cgroup", dir).Msg("workers contained by a cgroup")
			return c, nil
		}
		if mode == ContainCgroup {
			return nil, err
		}
		c.log.Debug().Err(err).Msg("workers contained by the subreaper and a mark")
	}
	var mark [16]byte
	rand.Read(mark[:])
	c.mode, c.mark = ContainSubreaper, hex.EncodeToString(mark[:])
	if c.wasSubreaper, err = setSubreaper(); err != nil {
		return nil, fmt.Errorf("launcher: become a subreaper: %w", err)
	}
	// Adopted processes that die are reaped as they die: one that forks
	// and exits in a loop would otherwise fill the process table.
	c.sigchld, c.stopReaping = make(chan os.Signal, 1), make(chan struct{})
	signal.Notify(c.sigchld, syscall.SIGCHLD)
	c.reaping.Go(c.reapLoop)
	return c, nil
}

// Mode reports how c holds the workers: ContainCgroup or ContainSubreaper.
func (c *Containment) Mode() ContainMode { return c.mode }

// StartKeeper starts the keeper (see the function StartKeeper) and tells it
// the job's cgroup or mark, so that it kills all the job's processes when
// this process dies. The keeper's Close also closes c; if the keeper cannot
// start, c is closed at once.
func (c *Containment) StartKeeper(exe string, args ...string) (*Keeper, error) {
	c.starts.RLock()
	k, err := startKeeper(exe, []string{keeperCgroupEnv + "=" + c.cgroup, keeperMarkEnv + "=" + c.mark}, args...)
	if err == nil {
		c.record(k.cmd.Process.Pid)
		k.contain = c
	}
	c.starts.RUnlock()
	if err != nil {
		c.Close()
		return nil, err
	}
	return k, nil
}

// Close kills whatever the job's workers left, removes the job's cgroup and
// stops reaping. Closing twice is harmless.
func (c *Containment) Close() error {
	if c == nil {
		return nil
	}
	c.closeOnce.Do(func() {
		if c.cgroup != "" {
			c.closeErr = killCgroup(c.cgroup, killWait)
			if err := removeCgroup(c.cgroup); err != nil && c.closeErr == nil {
				c.closeErr = err
			}
			return
		}
		close(c.stopReaping)
		c.reaping.Wait()
		signal.Stop(c.sigchld)
		c.starts.Lock()
		c.killLeftovers()
		c.starts.Unlock()
		if !c.wasSubreaper {
			if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); err != nil {
				c.closeErr = fmt.Errorf("launcher: stop being a subreaper: %w", err)
			}
		}
	})
	return c.closeErr
}

// reapLoop reaps adopted processes as they die, until Close.
func (c *Containment) reapLoop() {
	for {
		select {
		case <-c.stopReaping:
			return
		case <-c.sigchld:
			c.starts.Lock()
			reapAdopted(c.isStarted)
			c.starts.Unlock()
		}
	}
}

// killLeftovers kills, in subreaper mode, what leftovers picks; c.starts
// must be held for writing.
func (c *Containment) killLeftovers() {
	killed, left := killLeftovers(c.mark, c.isStarted, func() { reapAdopted(c.isStarted) }, killWait, execSettle, false)
	if len(killed) > 0 {
		c.log.Info().Ints("pids", killed).Msg("killed processes the workers left behind")
	}
	if len(left) > 0 {
		c.log.Error().Ints("pids", left).Msg("processes the workers left behind outlived SIGKILL")
	}
}

func (c *Containment) record(pid int) {
	c.mu.Lock()
	c.started[pid] = true
	c.mu.Unlock()
}

func (c *Containment) forget(pid int) {
	c.mu.Lock()
	delete(c.started, pid)
	c.mu.Unlock()
}

func (c *Containment) isStarted(pid int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started[pid]
}

// containment is the Containment that started k, if any.
func (k *Keeper) containment() *Containment {
	if k == nil {
		return nil
	}
	return k.contain
}

// cell is one group's share of a Containment. A nil *cell contains
// nothing: a group without a containment.
type cell struct {
	c       *Containment
	dir     string   // the group's cgroup, in cgroup mode
	fd      *os.File // dir, open, for the workers to start in (CgroupFD)
	running atomic.Int64
	// unstarted counts the workers yet to try their start. Workers start
	// side by side, so all that started may be dead before the last one
	// starts; the cell is swept only once none is left to start: a
	// cgroup killed through cgroup.kill kills what is cloned into it
	// later (seen on 6.18: every later worker died of SIGKILL).
	unstarted atomic.Int64
}

// newCell makes the cell of a group of n workers: in cgroup mode a cgroup
// of its own below the job's, so that a group that ends is killed alone.
func (c *Containment) newCell(n int) (*cell, error) {
	if c == nil {
		return nil, nil
	}
	cl := &cell{c: c}
	cl.unstarted.Store(int64(n))
	if c.cgroup == "" {
		return cl, nil
	}
	dir := filepath.Join(c.cgroup, fmt.Sprintf("group-%d", c.cells.Add(1)))
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("launcher: cgroup for the workers: %w", err)
	}
	fd, err := os.Open(dir)
	if err != nil {
		unix.Rmdir(dir)
		return nil, fmt.Errorf("launcher: cgroup for the workers: %w", err)
	}
	cl.dir, cl.fd = dir, fd
	return cl, nil
}

// confine makes cmd start inside the cell: in its cgroup from the first
// instruction (clone3 puts the child there, so nothing it forks can be
// outside), or carrying the job's mark.
func (cl *cell) confine(cmd *exec.Cmd) {
	if cl == nil {
		return
	}
	if cl.fd != nil {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cl.fd.Fd())
	}
	if cl.c.mark != "" {
		cmd.Env = append(withoutKey(cmd.Env, JobMarkEnv), JobMarkEnv+"="+cl.c.mark)
	}
}

// start runs start, which starts cmd, and records the new worker.
func (cl *cell) start(cmd *exec.Cmd, start func() error) error {
	if cl == nil {
		return start()
	}
	cl.c.starts.RLock()
	defer cl.c.starts.RUnlock()
	defer cl.unstarted.Add(-1)
	if err := start(); err != nil {
		return err
	}
	cl.c.record(cmd.Process.Pid)
	cl.running.Add(1)
	cl.c.running.Add(1)
	return nil
}

// exited notes that a worker of the cell has died (not yet reaped); after
// the last one, the cell is swept.
func (cl *cell) exited() {
	if cl == nil {
		return
	}
	cl.c.running.Add(-1)
	if cl.running.Add(-1) == 0 && cl.unstarted.Load() == 0 {
		cl.sweep()
	}
}

// reaped forgets a worker whose exit status has been collected.
func (cl *cell) reaped(pid int) {
	if cl != nil {
		cl.c.forget(pid)
	}
}

// sweep SIGKILLs what the cell's workers left behind, unless a worker
// runs: in cgroup mode the group's cgroup; in subreaper mode, while no
// worker of the job runs, the job's marked and adopted processes.
func (cl *cell) sweep() {
	cl.c.starts.Lock()
	defer cl.c.starts.Unlock()
	if cl.running.Load() > 0 || cl.unstarted.Load() > 0 {
		return // a worker started, or is to, since its last sibling died
	}
	if cl.dir == "" {
		if cl.c.running.Load() == 0 {
			cl.c.killLeftovers()
		}
		return
	}
	if pids := cgroupPids(cl.dir); len(pids) > 0 {
		cl.c.log.Info().Ints("pids", pids).Msg("killing processes the workers left behind")
	}
	if err := killCgroup(cl.dir, killWait); err != nil {
		cl.c.log.Error().Err(err).Msg("processes the workers left behind outlived SIGKILL")
	}
}

// close sweeps the cell and removes its cgroup, once every worker in it
// has been reaped.
func (cl *cell) close() {
	if cl == nil {
		return
	}
	cl.sweep()
	if cl.fd != nil {
		cl.fd.Close()
		if err := removeCgroup(cl.dir); err != nil {
			cl.c.log.Warn().Err(err).Msg("removing the workers' cgroup")
		}
	}
}

// Keeper side: what the keeper kills when the agent is gone.
const (
	keeperCgroupEnv = "GORUN_KEEPER_CGROUP"
	keeperMarkEnv   = "GORUN_KEEPER_MARK"
)

// keeperJob reads the job's cgroup and mark in the keeper's environment.
func keeperJob(lookupEnv func(string) (string, bool)) (cgroup, mark string) {
	cgroup, _ = lookupEnv(keeperCgroupEnv)
	mark, _ = lookupEnv(keeperMarkEnv)
	return cgroup, mark
}

// killJob kills, in the keeper, every process of the job: the whole cgroup,
// which it then removes, or every process of ours that carries the mark,
// and their descendants.
func killJob(cgroup, mark string) error {
	var errs []error
	if cgroup != "" {
		errs = append(errs, killCgroup(cgroup, killWait), removeCgroup(cgroup))
	}
	if mark != "" {
		none := func(int) bool { return false }
		if _, left := killLeftovers(mark, none, func() {}, killWait, execSettle, true); len(left) > 0 {
			errs = append(errs, fmt.Errorf("processes %v of the job outlived SIGKILL", left))
		}
	}
	return errors.Join(errs...)
}
