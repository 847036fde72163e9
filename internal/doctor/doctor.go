// Package doctor writes gorun doctor's report: what a job started on this
// node would meet. Its sections are the host (name, what the name resolves
// to, CPUs), the GPUs NVML lists, the Python interpreter and its torch,
// the NCCL and CUDA driver libraries the
// NCCL backend would load, the network interfaces, whether the store port
// is free, and the Slurm step. A missing GPU or library is part of the
// report, not an error.
//
// Everything the report reads of the node comes through Config, so that
// tests can stand in for NVML, the libraries, the environment and the
// network.
package doctor

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"text/tabwriter"

	"github.com/gorun/gorun/cuda"
	"github.com/gorun/gorun/cuda/nvml"
	"github.com/gorun/gorun/launcher"
)

// Config is what the report is about. The fields after Python stand in for
// the node; nil reads this node's, except the environment, which the
// package never reads itself: nil LookupEnv and Environ are empty, and
// gorun doctor passes os.LookupEnv and os.Environ.
type Config struct {
	// StorePort is the port a job here would host its store on.
	StorePort StorePort
	// Python is the interpreter in whose site-packages NCCL is looked for;
	// empty means $PYTHON_EXEC, else python3.
	Python string

	LookupEnv  func(key string) (string, bool)                          // nil: nothing is set
	Environ    func() []string                                          // nil: empty
	Hostname   func() (string, error)                                   // os.Hostname
	LookupHost func(ctx context.Context, host string) ([]string, error) // net.DefaultResolver.LookupHost
	Interfaces func() ([]Interface, error)                              // net.Interfaces
	NVML       nvml.Library                                             // nvml.New()
	// Libraries finds and probes NCCL and the CUDA driver: a cuda.Search
	// reading LookupEnv and asking Python.
	Libraries Libraries
	// AskPython runs the interpreter and reports on it and its torch.
	AskPython func(ctx context.Context, python string) (PythonInfo, error)
}

// withDefaults fills the fields left nil with this node's.
func (c Config) withDefaults() Config {
	if c.LookupEnv == nil {
		c.LookupEnv = func(string) (string, bool) { return "", false }
	}
	if c.Environ == nil {
		c.Environ = func() []string { return nil }
	}
	if c.Hostname == nil {
		c.Hostname = os.Hostname
	}
	if c.LookupHost == nil {
		c.LookupHost = net.DefaultResolver.LookupHost
	}
	if c.Interfaces == nil {
		c.Interfaces = systemInterfaces
	}
	if c.NVML == nil {
		c.NVML = nvml.New()
	}
	pythonExec, _ := c.LookupEnv("PYTHON_EXEC")
	c.Python = cmp.Or(c.Python, pythonExec, launcher.DefaultPython)
	if c.AskPython == nil {
		c.AskPython = AskPython
	}
	if c.Libraries == nil {
		c.Libraries = cuda.Search{LookupEnv: c.LookupEnv, Python: c.Python}
	}
	return c
}

// Write writes the report on the node cfg describes to w. It fails only
// when w does.
func Write(ctx context.Context, w io.Writer, cfg Config) error {
	cfg = cfg.withDefaults()
	r := &report{w: w}
	writeHost(ctx, r, cfg.Hostname, cfg.LookupHost)
	writeGPUs(r, cfg.NVML, cfg.LookupEnv)
	writePython(ctx, r, cfg.Python, cfg.AskPython)
	writeLibraries(ctx, r, cfg.Libraries, cfg.Python, cfg.LookupEnv, cfg.Environ())
	writeNetwork(r, cfg.Interfaces, cfg.LookupEnv)
	writePort(r, cfg.StorePort)
	writeSlurm(r, cfg.Environ())
	return r.err
}

// report writes the sections, keeping the first write error so that the
// sections need not check each line.
type report struct {
	w   io.Writer
	err error
}

func (r *report) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	n, err := r.w.Write(p)
	if err != nil {
		r.err = fmt.Errorf("doctor: write the report: %w", err)
	}
	return n, err
}

func (r *report) section(title string) {
	fmt.Fprintf(r, "\n== %s\n", title)
}

func (r *report) line(format string, args ...any) {
	fmt.Fprintf(r, format+"\n", args...)
}

// table returns a writer that aligns tab-separated columns until flushed.
func (r *report) table() *tabwriter.Writer {
	return tabwriter.NewWriter(r, 0, 0, 2, ' ', 0)
}
