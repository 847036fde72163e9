package collective

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strings"
)

// listenLocal listens on a Unix socket in the abstract namespace, which
// needs no file and vanishes with the process.
func listenLocal() (net.Listener, error) {
	var b [8]byte
	rand.Read(b[:])
	return net.Listen("unix", "@gorun-collective-"+hex.EncodeToString(b[:]))
}

// hostIdentity names this boot of this host: ranks that share it can
// reach each other's abstract sockets, if they share a network namespace
// (else the dial fails and TCP is used).
func hostIdentity() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	name, _ := os.Hostname()
	return strings.TrimSpace(string(boot)) + "/" + name
}
