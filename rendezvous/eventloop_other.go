//go:build !linux

package rendezvous

import (
	"net"
	"syscall"
)

// eventLoop exists on Linux only (eventloop_linux.go); elsewhere every
// connection is served on its goroutine path.
type eventLoop struct{}

func newEventLoop(*Server) *eventLoop { return nil }

func (*eventLoop) park(*conn) bool { return false }

func (*eventLoop) stop() {}

func (*eventLoop) handshakeExpired(*conn) {}

func (c *conn) writeNow(p []byte) (int, error) { return c.nc.Write(p) }

func (c *conn) sendByte(byte) bool { return false }

func forLoop(_ *conn, nc net.Conn) (net.Conn, syscall.RawConn) { return nc, nil }
