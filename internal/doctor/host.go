package doctor

import (
	"context"
	"fmt"
	"net"
	goruntime "runtime"
	"strings"
	"time"
)

// resolveTimeout bounds the lookup of this node's own name.
const resolveTimeout = 3 * time.Second

// writeHost says who this node is to its peers, and its CPUs.
func writeHost(ctx context.Context, r *report, hostname func() (string, error), lookupHost func(context.Context, string) ([]string, error)) {
	r.line("gorun doctor (%s/%s, %s)", goruntime.GOOS, goruntime.GOARCH, goruntime.Version())
	r.section("Host")
	host, err := hostname()
	if err != nil {
		r.line("hostname: unknown (%v)", err)
	} else {
		r.line("hostname: %s", host)
		// Peers reach this node by name: a name that resolves to loopback
		// only is a classic multi-node failure.
		ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		defer cancel()
		addrs, err := lookupHost(ctx, host)
		switch {
		case err != nil:
			r.line("resolves to: nothing (%v)", err)
		case allLoopback(addrs):
			r.line("resolves to: %s (loopback only: other nodes cannot reach this one by its name; give --local-addr or fix /etc/hosts)", strings.Join(addrs, ", "))
		default:
			r.line("resolves to: %s", strings.Join(addrs, ", "))
		}
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

// An Interface is a network interface as the report shows it.
type Interface struct {
	Name         string
	Up, Loopback bool
	MTU          int
	Addrs        []string // with their prefix length: "10.0.0.7/24"
	AddrsErr     error    // why the addresses are unknown
}

// systemInterfaces lists this node's interfaces.
func systemInterfaces() ([]Interface, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(ifaces))
	for _, ifc := range ifaces {
		i := Interface{
			Name:     ifc.Name,
			Up:       ifc.Flags&net.FlagUp != 0,
			Loopback: ifc.Flags&net.FlagLoopback != 0,
			MTU:      ifc.MTU,
		}
		addrs, err := ifc.Addrs()
		i.AddrsErr = err
		for _, a := range addrs {
			i.Addrs = append(i.Addrs, a.String())
		}
		out = append(out, i)
	}
	return out, nil
}

// writeNetwork lists the interfaces, which are what NCCL_SOCKET_IFNAME,
// GLOO_SOCKET_IFNAME and --local-addr choose among.
func writeNetwork(r *report, interfaces func() ([]Interface, error), lookupEnv func(string) (string, bool)) {
	r.section("Network interfaces")
	ifaces, err := interfaces()
	if err != nil {
		r.line("cannot list them: %v", err)
		return
	}
	t := r.table()
	for _, ifc := range ifaces {
		state := "down"
		if ifc.Up {
			state = "up"
		}
		kind := ""
		if ifc.Loopback {
			kind = "loopback"
		}
		var shown []string
		if ifc.AddrsErr != nil {
			shown = append(shown, fmt.Sprintf("(addresses unknown: %v)", ifc.AddrsErr))
		}
		shown = append(shown, ifc.Addrs...)
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
