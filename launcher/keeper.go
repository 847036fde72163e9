package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/shmname"
)

// keeperEnv marks a process started by StartKeeper.
const keeperEnv = "GORUN_KEEPER"

// Keeper is the agent's end of a guardian process that SIGKILLs the
// recorded process groups when the agent goes away, however it goes: the
// kernel closes the agent's end of the pipe even on kill -9, and the keeper
// acts on that EOF. A nil *Keeper records nothing.
//
// The protocol is one line per change on the keeper's stdin: "+<pgid>" to
// record a group, "-<pgid>" to forget it, and "d<quoted path>" to have the
// keeper remove the job's temporary folder when the agent is gone.
//
// After the groups are killed, the keeper also removes what the dead
// left: the temporary folders recorded (unless they hold worker logs)
// and the shared-memory segments whose creator is no longer alive
// (internal/shmname), which a worker killed while setting them up leaves
// in /dev/shm.
type Keeper struct {
	cmd     *exec.Cmd
	contain *Containment // closed with the keeper; nil without one

	mu      sync.Mutex
	records *os.File     // write end of the keeper's stdin; nil once closed
	groups  map[int]bool // what the keeper holds, for Close to act on
	dirs    []string
}

// StartKeeper starts exe (normally the agent's own binary, os.Executable)
// with args as the keeper; exe's main must call MaybeRunKeeper first thing.
// The keeper runs in a process group of its own, so that a Ctrl-C at the
// terminal does not reach it.
func StartKeeper(exe string, args ...string) (*Keeper, error) {
	return startKeeper(exe, nil, args...)
}

// startKeeper starts the keeper with env, and the mark that makes it
// one, as its whole environment: it needs nothing of the agent's.
func startKeeper(exe string, env []string, args ...string) (*Keeper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launcher: start keeper: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(slices.Clone(env), keeperEnv+"=1")
	cmd.Stdin = r
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The write end is close-on-exec, so neither the keeper nor any worker
	// holds it: only the agent's death or Close can end the keeper's input.
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("launcher: start keeper: %w", err)
	}
	return &Keeper{cmd: cmd, records: w, groups: make(map[int]bool)}, nil
}

// Track records process group pgid, to be killed if the agent dies.
func (k *Keeper) Track(pgid int) error { return k.send('+', pgid) }

// Untrack forgets process group pgid.
func (k *Keeper) Untrack(pgid int) error { return k.send('-', pgid) }

func (k *Keeper) send(op byte, pgid int) error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.records == nil {
		return errKeeperClosed
	}
	if _, err := fmt.Fprintf(k.records, "%c%d\n", op, pgid); err != nil {
		return fmt.Errorf("launcher: keeper: %w", err)
	}
	if op == '+' {
		k.groups[pgid] = true
	} else {
		delete(k.groups, pgid)
	}
	return nil
}

// RemoveOnExit records the job's temporary folder dir, which the keeper
// removes when the agent is gone unless a worker's log is in it (as the
// agent itself does when it ends; see HasLogFiles).
func (k *Keeper) RemoveOnExit(dir string) error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.records == nil {
		return errKeeperClosed
	}
	if _, err := fmt.Fprintf(k.records, "d%s\n", strconv.Quote(dir)); err != nil {
		return fmt.Errorf("launcher: keeper: %w", err)
	}
	k.dirs = append(k.dirs, dir)
	return nil
}

var errKeeperClosed = errors.New("launcher: keeper closed")

// Close ends the keeper at the agent's end. The agent does here what the
// keeper would do at its death: it kills the groups still recorded,
// closes the Containment (which kills and removes whatever the job
// left), and sweeps what the dead left. Then it dismisses the keeper with
// SIGKILL, so that the agent's exit never waits for the keeper, which may
// still be starting: a process of this binary spends tens of milliseconds
// initialising its packages, longer than a short job runs. Closing twice
// is harmless.
func (k *Keeper) Close() error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	records := k.records
	k.records = nil
	groups := slices.Sorted(maps.Keys(k.groups))
	dirs := k.dirs
	k.mu.Unlock()
	if records == nil {
		return nil
	}
	// The keeper guards until all that is done: its input stays open.
	err := errors.Join(killGroups(groups), k.contain.Close(), sweep(groups, dirs))
	k.cmd.Process.Kill()
	k.cmd.Wait() // killed, as it was told
	return errors.Join(err, records.Close())
}

// MaybeRunKeeper runs the keeper and returns true when this process was
// started by StartKeeper, as its environment says (main passes
// os.LookupEnv); main should then return at once. Otherwise it returns
// false immediately.
func MaybeRunKeeper(lookupEnv func(string) (string, bool)) bool {
	if v, _ := lookupEnv(keeperEnv); v != "1" {
		return false
	}
	// The keeper must outlive the agent, whatever the terminal or a
	// supervisor sends to everyone.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	cgroup, mark := keeperJob(lookupEnv)
	groups, dirs := keep(os.Stdin, os.Stderr)
	err := errors.Join(killGroups(groups), killJob(cgroup, mark), sweep(groups, dirs))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gorun keeper: %v\n", err)
	}
	return true
}

// killGroups SIGKILLs the recorded process groups. A recorded group still
// exists while any member lives, so its id cannot have been reused.
func killGroups(groups []int) error {
	var errs []error
	for _, pgid := range groups {
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill process group %d: %w", pgid, err))
		}
	}
	return errors.Join(errs...)
}

// sweep removes what the agent's job left once its processes are gone:
// the temporary folders dirs, unless they hold worker logs, and the
// shared-memory segments of dead creators.
func sweep(groups []int, dirs []string) error {
	// The segments' creators must be dead to be swept: give the killed
	// groups a moment to go.
	deadline := time.Now().Add(keeperSweepWait)
	for _, pgid := range groups {
		for syscall.Kill(-pgid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	var errs []error
	for _, dir := range dirs {
		if HasLogFiles(dir) {
			continue
		}
		errs = append(errs, RemoveTree(dir))
	}
	if _, err := shmname.Sweep(ShmDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// keeperSweepWait bounds the keeper's wait for killed groups to end
// before it sweeps: zombies a parent never reaps count as gone after it.
const keeperSweepWait = 2 * time.Second

// ShmDir is where the collective runtime's shared-memory segments live.
const ShmDir = "/dev/shm"

// keep reads records until EOF and returns the groups still recorded
// and the folders to remove, complaining to warn about malformed records.
// A read error means the same as EOF: the agent is gone.
func keep(records io.Reader, warn io.Writer) (groups []int, dirs []string) {
	recorded := make(map[int]bool)
	scanner := bufio.NewScanner(records)
	for scanner.Scan() {
		if dir, ok := strings.CutPrefix(scanner.Text(), "d"); ok {
			if dir, err := strconv.Unquote(dir); err == nil && filepath.IsAbs(dir) {
				dirs = append(dirs, dir)
			} else {
				fmt.Fprintf(warn, "gorun keeper: ignoring record %q\n", scanner.Text())
			}
			continue
		}
		add, pgid, ok := parseRecord(scanner.Text())
		switch {
		case !ok:
			fmt.Fprintf(warn, "gorun keeper: ignoring record %q\n", scanner.Text())
		case add:
			recorded[pgid] = true
		default:
			delete(recorded, pgid)
		}
	}
	return slices.Sorted(maps.Keys(recorded)), dirs
}

// parseRecord parses "+<pgid>" or "-<pgid>".
func parseRecord(line string) (add bool, pgid int, ok bool) {
	if len(line) < 2 || (line[0] != '+' && line[0] != '-') {
		return false, 0, false
	}
	pgid, err := strconv.Atoi(line[1:])
	return line[0] == '+', pgid, err == nil && pgid > 0
}

// withoutKey returns env without any entry for key.
func withoutKey(env []string, key string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(entry string) bool {
		return strings.HasPrefix(entry, key+"=")
	})
}
