package elastic

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ParseNNodes parses --nnodes: "N" or "MIN:MAX" with 0 < MIN <= MAX.
func ParseNNodes(s string) (min, max int, err error) {
	lo, hi, ranged := strings.Cut(strings.TrimSpace(s), ":")
	if min, err = strconv.Atoi(lo); err == nil {
		max = min
		if ranged {
			max, err = strconv.Atoi(hi)
		}
	}
	if err != nil || min < 1 || min > max {
		return 0, 0, fmt.Errorf("--nnodes %q: want N or MIN:MAX with 0 < MIN <= MAX", s)
	}
	return min, max, nil
}

// ResolveNProc turns --nproc-per-node into a count: an integer, "cpu" (the
// CPUs this process may use), "gpu" (the GPUs countGPUs reports; an error
// when there are none) or "auto" (GPUs when there are any, else CPUs), as
// torchrun does. countGPUs is asked only for gpu and auto; the launcher
// passes one backed by NVML, which needs cgo, so this package stays free of
// it.
func ResolveNProc(s string, countGPUs func() (int, error)) (int, error) {
	switch s {
	case "cpu":
		return goruntime.NumCPU(), nil
	case "gpu":
		n, err := countGPUs()
		switch {
		case err != nil:
			return 0, fmt.Errorf("--nproc-per-node gpu: cannot count GPUs: %w", err)
		case n < 1:
			return 0, errors.New("--nproc-per-node gpu: no GPU on this node")
		}
		return n, nil
	case "auto":
		if n, err := countGPUs(); err == nil && n > 0 {
			return n, nil
		}
		return goruntime.NumCPU(), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--nproc-per-node %q: want a positive integer, auto, cpu or gpu", s)
	}
	return n, nil
}

// ParseRdzvConf parses --rdzv-conf "k1=v1,k2=v2".
func ParseRdzvConf(s string) (map[string]string, error) {
	conf := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--rdzv-conf %q: %q is not key=value", s, kv)
		}
		conf[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return conf, nil
}

// ParseSignals parses --signals-to-handle: names with or without the SIG
// prefix, or numbers, separated by commas.
func ParseSignals(s string) ([]syscall.Signal, error) {
	var sigs []syscall.Signal
	for _, name := range strings.Split(s, ",") {
		name = strings.ToUpper(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		sig := unix.SignalNum(name)
		if sig == 0 {
			sig = unix.SignalNum("SIG" + name)
		}
		if n, err := strconv.Atoi(name); err == nil && n > 0 && unix.SignalName(syscall.Signal(n)) != "" {
			sig = syscall.Signal(n)
		}
		if sig == 0 {
			return nil, fmt.Errorf("--signals-to-handle %q: unknown signal %q", s, name)
		}
		if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
			return nil, fmt.Errorf("--signals-to-handle %q: %s cannot be handled", s, name)
		}
		sigs = append(sigs, sig)
	}
	return sigs, nil
}

// Hostname names this node in reports and log prefixes.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
