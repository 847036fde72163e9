package elastic

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

func TestMemberIPs(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]net.IPAddr, error) {
		if host == "gpu2" {
			return []net.IPAddr{{IP: net.ParseIP("10.0.0.2")}, {IP: net.ParseIP("fd00::2")}}, nil
		}
		return nil, errors.New("no such host")
	}
	nodes := []rendezvous.NodeInfo{
		{ID: "a", Addr: "10.0.0.1"},
		{ID: "b", Addr: "gpu2"},
		{ID: "c", Addr: "nowhere"},
		{ID: "d"},
		{ID: "e", Addr: "fd00::5"},
	}
	got := memberIPs(context.Background(), nodes, lookup, zerolog.Nop())
	want := []string{"10.0.0.1", "10.0.0.2", "fd00::2", "fd00::5"}
	var texts []string
	for _, ip := range got {
		texts = append(texts, ip.String())
	}
	if !slices.Equal(texts, want) {
		t.Fatalf("memberIPs = %v, want %v", texts, want)
	}
}
