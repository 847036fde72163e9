// Package shmname names the shared-memory segments of gorun's collective
// runtime and finds the ones their creator left behind.
//
// A segment's name carries its creator: the pid namespace, the process id
// and the process's start time (so that a reused pid is not taken for
// the creator), then a random part and the rank:
//
//	gorun-collective-<pidns>-<pid>-<start>-<16 hex digits>-<rank>
//
// A segment is normally unlinked by its creator as soon as every peer
// has mapped it; a creator killed before that leaves the file in
// /dev/shm, and Sweep removes it once the creator is gone. Names read
// from the store are accepted only in exactly this form (Parse), so that
// no value there can name a file outside /dev/shm.
package shmname

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Prefix starts every segment name gorun makes.
const Prefix = "gorun-collective-"

// Creator is the process that made a segment.
type Creator struct {
	PidNS uint64 // inode of the creator's pid namespace
	Pid   int
	Start uint64 // start time, in clock ticks after boot (/proc/<pid>/stat)
}

// Name is one segment's name, in its parts.
type Name struct {
	Creator
	Random string // 16 lowercase hex digits
	Rank   int
}

// String formats n as gorun names segments.
func (n Name) String() string {
	return fmt.Sprintf("%s%d-%d-%d-%s-%d", Prefix, n.PidNS, n.Pid, n.Start, n.Random, n.Rank)
}

// Parse accepts a segment name in exactly the form String makes: no
// other text, no path separator, no sign or leading zero in a number.
func Parse(s string) (Name, bool) {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return Name{}, false
	}
	f := strings.Split(rest, "-")
	if len(f) != 5 {
		return Name{}, false
	}
	var n Name
	var ok1, ok2, ok3, ok4 bool
	n.PidNS, ok1 = decimal(f[0])
	pid, ok2 := decimal(f[1])
	n.Start, ok3 = decimal(f[2])
	rank, ok4 := decimal(f[4])
	if !ok1 || !ok2 || !ok3 || !ok4 || !isHex16(f[3]) || pid < 1 || pid > 1<<22 || rank > 1<<31-1 {
		return Name{}, false
	}
	n.Pid, n.Random, n.Rank = int(pid), f[3], int(rank)
	return n, true
}

// decimal parses digits with no sign and no leading zero, at most 20.
func decimal(s string) (uint64, bool) {
	if s == "" || len(s) > 20 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func isHex16(s string) bool {
	if len(s) != 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !('0' <= s[i] && s[i] <= '9' || 'a' <= s[i] && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// Self is the calling process as a segment's creator.
func Self() (Creator, error) {
	ns, err := pidNamespace()
	if err != nil {
		return Creator{}, err
	}
	start, _, err := processStart(os.Getpid())
	if err != nil {
		return Creator{}, err
	}
	return Creator{PidNS: ns, Pid: os.Getpid(), Start: start}, nil
}

// Alive reports whether c still runs: a process with c's pid and start
// time exists in this pid namespace and is not a zombie. A creator in
// another pid namespace is taken as alive: its pids mean nothing here.
func (c Creator) Alive(ns uint64) bool {
	if c.PidNS != ns {
		return true
	}
	start, zombie, err := processStart(c.Pid)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH)
	}
	return start == c.Start && !zombie
}

func pidNamespace() (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0, fmt.Errorf("shmname: pid namespace: %w", err)
	}
	return st.Ino, nil
}

// processStart reads pid's start time and whether it is a zombie (or
// dead) from /proc/<pid>/stat.
func processStart(pid int) (start uint64, zombie bool, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	return parseStat(data)
}

// parseStat reads fields 3 (state) and 22 (starttime) of a stat line;
// the command name in field 2 may hold spaces and parentheses, so the
// fields are counted after its last ')'.
func parseStat(data []byte) (start uint64, zombie bool, err error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false, errors.New("shmname: malformed /proc stat line")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, false, errors.New("shmname: short /proc stat line")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("shmname: start time: %w", err)
	}
	return start, f[0] == "Z" || f[0] == "X", nil
}

// Sweep removes from dir (normally /dev/shm) the segments gorun named
// whose creator is no longer alive and that belong to this user (any
// user's, for root). A link or anything but a plain file is left alone.
// It returns the names it removed.
func Sweep(dir string) ([]string, error) {
	ns, err := pidNamespace()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("shmname: sweep %s: %w", dir, err)
	}
	uid := os.Geteuid()
	var removed []string
	var errs []error
	for _, e := range entries {
		n, ok := Parse(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // gone meanwhile
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || (uid != 0 && int(st.Uid) != uid) || n.Alive(ns) {
			continue
		}
		// The name is one plain component (Parse), so this removes
		// exactly that entry of dir, never through a link.
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}
