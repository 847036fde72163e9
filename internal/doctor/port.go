package doctor

import (
	"net"
	"strconv"
)

// StorePort is the port the report checks, and where it comes from.
type StorePort struct {
	Port   int
	Source string // e.g. "--master-port", "torchrun's default"
}

// writePort says whether the store could listen on its port here, which
// matters on the node that hosts the store.
func writePort(r *report, p StorePort) {
	r.section("Store port")
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(p.Port)))
	if err != nil {
		r.line("%d/tcp (%s): busy on this host: %v", p.Port, p.Source, err)
		return
	}
	l.Close()
	r.line("%d/tcp (%s): free on this host", p.Port, p.Source)
}
