package route

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

func TestSourceAddr(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		addr, want string
	}{
		{"127.0.0.1:29500", "127.0.0.1"},
		{"localhost:9", "127.0.0.1"},
	} {
		got, err := SourceAddr(ctx, tc.addr)
		if err != nil || got != tc.want {
			t.Errorf("SourceAddr(%q) = %q, %v; want %q", tc.addr, got, err, tc.want)
		}
	}
}

// The address is the one a real connection to the host leaves from.
func TestSourceAddrIsWhereConnectionsComeFrom(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "127.0.0.2"} {
		l, err := net.Listen("tcp", host+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		want := c.LocalAddr().(*net.TCPAddr).IP.String()
		if got, err := SourceAddr(context.Background(), l.Addr().String()); err != nil || got != want {
			t.Errorf("towards %s: %q, %v; a connection there comes from %s", l.Addr(), got, err, want)
		}
	}
}

func TestSourceAddrErrors(t *testing.T) {
	ctx := context.Background()
	// None needs a name server: a test sends nothing beyond loopback.
	for _, addr := range []string{"127.0.0.1", "127.0.0.1:port", "127.0.0.1:99999", "[::1:9"} {
		got, err := SourceAddr(ctx, addr)
		if err == nil || !strings.HasPrefix(err.Error(), "route: the local address towards "+addr+": ") {
			t.Errorf("SourceAddr(%q) = %q, %v; want a route: error", addr, got, err)
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if got, err := SourceAddr(canceled, "127.0.0.1:9"); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled context: %q, %v; want context.Canceled", got, err)
	}
}
