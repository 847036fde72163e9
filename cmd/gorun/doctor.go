package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/cuda/nvml"
	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// torchrunMasterPort is the store port torchrun uses when none is given.
const torchrunMasterPort = 29500

// doctorCommand is `gorun doctor`: a report of what a job on this node
// would meet (GPUs, NCCL and CUDA libraries, network interfaces, whether
// the store port is free, Slurm), for whoever debugs a cluster. What is
// missing is part of the report, so it exits 0 unless the report cannot be
// written or a flag is wrong.
func doctorCommand(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "report this node's GPUs, NCCL and CUDA libraries, network interfaces and store port",
		Description: "Prints what a job started here would meet. Nothing is changed; a missing GPU or\n" +
			"library is reported, not an error. The store port checked is --rdzv-endpoint's, else\n" +
			"--master-port, else the Slurm step's, else torchrun's default 29500.",
		Flags: []cli.Flag{
			stringFlag("master-port", "", "store port to check (default 29500)"),
			stringFlag("rdzv-endpoint", "", "rendezvous store HOST[:PORT] whose port to check (default port 29400)"),
			stringFlag("python", "", "Python interpreter whose site-packages are searched for NCCL (default $PYTHON_EXEC or python3)"),
		},
		Action: func(c *cli.Context) error {
			port, err := doctorStorePort(c, os.LookupEnv)
			if err != nil {
				return usageError{err}
			}
			python := cmp.Or(inheritedString(c, "python"), os.Getenv("PYTHON_EXEC"), launcher.DefaultPython)
			r := &report{w: stdout}
			doctorHost(c.Context, r)
			doctorGPUs(r, nvml.New(), os.LookupEnv)
			doctorLibraries(c.Context, r, os.LookupEnv, python)
			doctorNetwork(r, os.LookupEnv)
			doctorPort(r, port)
			doctorSlurm(r, os.Environ())
			return r.err
		},
	}
}

// report writes the doctor's sections, keeping the first write error so
// that the sections need not check each line.
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

func doctorHost(ctx context.Context, r *report) {
	r.line("gorun doctor (%s/%s, %s)", goruntime.GOOS, goruntime.GOARCH, goruntime.Version())
	r.section("Host")
	host := elastic.Hostname()
	r.line("hostname: %s", host)
	// Peers reach this node by name: a name that resolves to loopback
	// only is a classic multi-node failure.
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	switch {
	case err != nil:
		r.line("resolves to: nothing (%v)", err)
	case allLoopback(addrs):
		r.line("resolves to: %s (loopback only: other nodes cannot reach this one by its name; give --local-addr or fix /etc/hosts)", strings.Join(addrs, ", "))
	default:
		r.line("resolves to: %s", strings.Join(addrs, ", "))
	}
	r.line("CPUs: %d usable by this process (--nproc-per-node cpu)", goruntime.NumCPU())
}

func allLoopback(addrs []string) bool {
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return len(addrs) > 0
}

// doctorGPUs reports what NVML says, or why it says nothing, and what
// --nproc-per-node gpu and auto would give.
func doctorGPUs(r *report, lib nvml.Library, lookupEnv func(string) (string, bool)) {
	r.section("GPUs (NVML)")
	cpus := goruntime.NumCPU()
	sys, err := nvml.Discover(lib)
	if err != nil {
		r.line("no GPU listed: %v", err)
		r.line("--nproc-per-node gpu fails here; auto gives %d (the CPUs)", cpus)
		return
	}
	r.line("driver %s, CUDA driver API %s", cmp.Or(sys.DriverVersion, "unknown"), nvml.CUDAVersion(sys.CUDADriverVersion))
	if len(sys.GPUs) == 0 {
		r.line("NVML works but reports no GPU")
		r.line("--nproc-per-node gpu fails here; auto gives %d (the CPUs)", cpus)
		return
	}
	t := r.table()
	for _, g := range sys.GPUs {
		fmt.Fprintf(t, "GPU%d\t%s\t%d MiB\t%s\tbus %s\n", g.Index, cmp.Or(g.Name, "?"), g.MemoryTotal>>20, cmp.Or(g.UUID, "?"), cmp.Or(g.BusID, "?"))
	}
	t.Flush()

	visible := sys.GPUs
	if value, set := lookupEnv(nvml.VisibleDevicesEnv); set {
		visible, err = nvml.Visible(sys.GPUs, value)
		var order []string
		for k, g := range visible {
			order = append(order, fmt.Sprintf("cuda:%d = GPU%d", k, g.Index))
		}
		switch {
		case err != nil:
			r.line("%v", err)
		case len(visible) == 0:
			r.line("%s", nvml.HiddenBy(value, len(sys.GPUs)))
		default:
			r.line("%s=%q: %s", nvml.VisibleDevicesEnv, value, strings.Join(order, ", "))
		}
	}
	if len(visible) > 0 {
		r.line("--nproc-per-node gpu and auto give %d", len(visible))
	} else {
		r.line("--nproc-per-node gpu fails here; auto gives %d (the CPUs)", cpus)
	}
	if len(sys.GPUs) > 1 {
		r.line("")
		nvml.WriteTopology(r, sys) // a failed write is kept in r.err
	}
	if sys.Partial != nil {
		r.line("NVML could not say: %s", strings.ReplaceAll(sys.Partial.Error(), "\n", "; "))
	}
}

// doctorNetwork lists the interfaces, which are what NCCL_SOCKET_IFNAME,
// GLOO_SOCKET_IFNAME and --local-addr choose among.
func doctorNetwork(r *report, lookupEnv func(string) (string, bool)) {
	r.section("Network interfaces")
	ifaces, err := net.Interfaces()
	if err != nil {
		r.line("cannot list them: %v", err)
		return
	}
	t := r.table()
	for _, ifc := range ifaces {
		state := "down"
		if ifc.Flags&net.FlagUp != 0 {
			state = "up"
		}
		kind := ""
		if ifc.Flags&net.FlagLoopback != 0 {
			kind = "loopback"
		}
		var shown []string
		addrs, err := ifc.Addrs()
		if err != nil {
			shown = append(shown, fmt.Sprintf("(addresses unknown: %v)", err))
		}
		for _, a := range addrs {
			shown = append(shown, a.String())
		}
		if len(shown) == 0 {
			shown = append(shown, "no address")
		}
		fmt.Fprintf(t, "%s\t%s\t%s\tmtu %d\t%s\n", ifc.Name, state, kind, ifc.MTU, strings.Join(shown, " "))
	}
	t.Flush()
	for _, name := range []string{"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} {
		if v, ok := lookupEnv(name); ok {
			r.line("%s=%s", name, v)
		}
	}
}

// storePort is the port the doctor checks, and where it comes from.
type storePort struct {
	port   int
	source string
}

// doctorStorePort picks the port a job here would host its store on, as
// the launcher does: --rdzv-endpoint, --master-port, the Slurm step, else
// torchrun's default.
func doctorStorePort(c *cli.Context, lookupEnv func(string) (string, bool)) (storePort, error) {
	if ep := inheritedString(c, "rdzv-endpoint"); ep != "" {
		host, port, err := net.SplitHostPort(ep)
		if err != nil {
			// HOST alone: the c10d default port.
			return storePort{rendezvous.DefaultEndpointPort, "--rdzv-endpoint " + ep + ", default port"}, nil
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return storePort{}, fmt.Errorf("--rdzv-endpoint %q: port %q is not a number from 1 to 65535", ep, port)
		}
		return storePort{n, "--rdzv-endpoint, store on " + host}, nil
	}
	if p := inheritedString(c, "master-port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return storePort{}, fmt.Errorf("--master-port %q: want a number from 1 to 65535", p)
		}
		return storePort{n, "--master-port"}, nil
	}
	if step, ok, err := launcher.DetectSlurm(lookupEnv); ok && err == nil {
		return storePort{step.Port(), "Slurm job " + step.JobID + ", store on " + step.Nodes[0]}, nil
	}
	return storePort{torchrunMasterPort, "torchrun's default; a one-node gorun job picks a free port itself"}, nil
}

// inheritedString is the flag name as the doctor was given it, or, when
// only gorun itself was (`gorun --master-port 1234 doctor`), gorun's.
func inheritedString(c *cli.Context, name string) string {
	for _, cc := range c.Lineage() {
		if cc.IsSet(name) {
			return cc.String(name)
		}
	}
	return ""
}

// doctorPort says whether the store could listen on its port here, which
// matters on the node that hosts the store.
func doctorPort(r *report, p storePort) {
	r.section("Store port")
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(p.port)))
	if err != nil {
		r.line("%d/tcp (%s): busy on this host: %v", p.port, p.source, err)
		return
	}
	l.Close()
	r.line("%d/tcp (%s): free on this host", p.port, p.source)
}

// doctorSlurm shows Slurm's variables and what gorun makes of them.
func doctorSlurm(r *report, environ []string) {
	r.section("Slurm")
	var vars []string
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SLURM_") {
			vars = append(vars, kv)
			env[k] = v
		}
	}
	if len(vars) == 0 {
		r.line("not inside a Slurm job (no SLURM_* variable)")
		return
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	step, ok, err := launcher.DetectSlurm(lookup)
	switch {
	case err != nil:
		r.line("gorun cannot read this Slurm step: %v", err)
	case !ok:
		r.line("inside a Slurm job but not an srun step: start gorun with srun, one task per node")
	default:
		r.line("srun step of job %s: node %d of %d, store on %s:%d, GPUs on node %d",
			step.JobID, step.NodeRank, step.NNodes, step.Nodes[0], step.Port(), step.GPUsOnNode)
	}
	slices.Sort(vars)
	for _, kv := range vars {
		r.line("  %s", kv)
	}
}
