package slurmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// daemon is a process Start ran in a mount namespace of its own: the
// namespace holds it and everything it spawns, and nothing else.
type daemon struct {
	name   string
	pid    int
	mntNS  string // the /proc/<pid>/ns/mnt link, such as "mnt:[4026532177]"
	out    string // the file that has its stdout and stderr
	exited chan struct{}
}

// start runs argv as daemon name in new namespaces (cloneflags, which
// include CLONE_NEWNS) and its own session, and records its namespace.
func (c *Cluster) start(t testing.TB, name string, cloneflags uintptr, argv ...string) *daemon {
	t.Helper()
	d := &daemon{name: name, out: filepath.Join(c.Dir, "log", name+".out"), exited: make(chan struct{})}
	f, err := os.Create(d.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = c.Env()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: cloneflags}
	if err := cmd.Start(); err != nil {
		t.Fatalf("slurmtest: start %s in new namespaces: %v", name, err)
	}
	d.pid = cmd.Process.Pid
	go func() { cmd.Wait(); close(d.exited) }()
	// clone(2) made the namespace, so it is the child's from its first
	// instruction; a process that is already gone has no link to read.
	d.mntNS, err = os.Readlink("/proc/" + strconv.Itoa(d.pid) + "/ns/mnt")
	if err != nil || hostNamespace(d.mntNS) {
		cmd.Process.Kill()
		<-d.exited
		t.Fatalf("slurmtest: %s has no mount namespace of its own (%q, %v):\n%s", name, d.mntNS, err, tail(d.out))
	}
	c.daemons = append(c.daemons, d)
	return d
}

// hostNamespace reports whether ns is this process's or init's mount
// namespace: killing "everything in it" would take down the machine. (Some
// sandboxes hide init's namespace even from root.)
func hostNamespace(ns string) bool {
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil || own == ns {
		return true
	}
	initNS, err := os.Readlink("/proc/1/ns/mnt")
	return err == nil && initNS == ns
}

func (d *daemon) hasExited() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// stop tears the cluster down: it cancels the jobs, then kills every
// process in each daemon's namespace, nodes first (slurmd, slurmstepd and
// the jobs' tasks), then slurmctld and its helpers, then munged.
func (c *Cluster) stop(t testing.TB) {
	begin := time.Now()
	if err := c.cancelJobs(); err != nil {
		t.Logf("slurmtest: cancelling the jobs before teardown: %v", err)
	}
	var errs []error
	for i := len(c.daemons) - 1; i >= 0; i-- {
		errs = append(errs, c.daemons[i].kill(5*time.Second))
	}
	if t.Failed() {
		t.Logf("slurmtest: the cluster's logs:\n%s", c.logs())
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("slurmtest: teardown: %v", err)
	}
	t.Logf("slurmtest: cluster torn down in %v", time.Since(begin).Round(time.Millisecond))
}

// cancelJobs asks slurmctld to cancel every job it knows of that has not
// ended, while it still runs.
func (c *Cluster) cancelJobs() error {
	if c.slurmctld == nil || c.slurmctld.hasExited() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := c.CommandContext(ctx, "squeue", "--noheader", "--format=%A").Output()
	if err != nil {
		return fmt.Errorf("squeue: %w", err)
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		return nil
	}
	if out, err := c.CommandContext(ctx, "scancel", ids...).CombinedOutput(); err != nil {
		return fmt.Errorf("scancel %v: %w: %s", ids, err, out)
	}
	return nil
}

// kill SIGKILLs every process in d's mount namespace until none is left
// (a dying slurmd may still fork), then waits for d itself to be reaped.
func (d *daemon) kill(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := processesIn(d.mntNS)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: processes %v of its namespace %s survive SIGKILL", d.name, pids, d.mntNS)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-d.exited:
		return nil
	case <-time.After(time.Until(deadline)):
		return fmt.Errorf("%s (pid %d) was killed but not reaped within %v", d.name, d.pid, timeout)
	}
}

// processesIn lists the live processes whose mount namespace is ns
// (zombies have none).
func processesIn(ns string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && link == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}
