package nvml

import (
	"strings"
	"testing"
)

// hgx is four GPUs whose NVLinks all end at NVSwitches, as on an HGX
// board: NVML reports no GPU at the far end, but NVLink P2P between all.
func hgx() *fakeLibrary {
	sw := []string{"00000000:C1:00.0", "00000000:C2:00.0", "", "00000000:C3:00.0", "00000000:C4:00.0"} // one link down
	f := &fakeLibrary{level: map[[2]int]Level{}, p2p: map[[2]int]P2PStatus{}, nvlinkP2P: map[[2]int]bool{}}
	for i, bus := range []string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"} {
		f.gpus = append(f.gpus, fakeGPU{name: "NVIDIA H100 80GB HBM3", uuid: "GPU-" + bus, bus: bus, links: sw})
		for j := range 4 {
			f.level[[2]int{i, j}] = LevelSystem
			f.p2p[[2]int{i, j}] = P2POK
			f.nvlinkP2P[[2]int{i, j}] = true
		}
	}
	return f
}

func TestNVLinksThroughNVSwitchesCountEveryActiveLink(t *testing.T) {
	sys, err := Discover(hgx())
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range sys.Links {
		for j, l := range row {
			if i != j && l.NVLinks != 4 {
				t.Errorf("GPU%d-GPU%d: %d NVLinks; want the 4 active links to the switches", i, j, l.NVLinks)
			}
		}
	}
}

// pcieBox is three PCIe GPUs: 0 and 1 joined by an NVLink bridge of two
// links (NVML writes the peer's domain with 4 digits there), 2 on the other
// socket, which may read but not write 0's memory.
func pcieBox() *fakeLibrary {
	return &fakeLibrary{
		gpus: []fakeGPU{
			{name: "A", uuid: "GPU-a", bus: "00000000:3B:00.0", links: []string{"0000:af:00.0", "0000:af:00.0"}},
			{name: "B", uuid: "GPU-b", bus: "00000000:AF:00.0", links: []string{"0000:3b:00.0", "0000:3b:00.0"}},
			{name: "C", uuid: "GPU-c", bus: "00000000:D8:00.0"},
		},
		level: map[[2]int]Level{
			{0, 1}: LevelSingle, {1, 0}: LevelSingle,
			{0, 2}: LevelSystem, {2, 0}: LevelSystem,
			{1, 2}: LevelSystem, // 2-1 unknown to NVML
		},
		p2p: map[[2]int]P2PStatus{
			{0, 1}: P2POK, {1, 0}: P2POK,
			{0, 2}: P2PTopologyNotSupported, {1, 2}: P2PTopologyNotSupported, {2, 1}: P2PTopologyNotSupported,
		},
		nvlinkP2P: map[[2]int]bool{{0, 1}: true, {1, 0}: true},
	}
}

func TestWriteTopologyLooksLikeNvidiaSmi(t *testing.T) {
	f := pcieBox()
	// GPU2 reads GPU0 but does not write it: the cell shows both.
	f.p2p[[2]int{2, 0}] = P2POK
	sys, err := Discover(f)
	if err != nil {
		t.Fatal(err)
	}
	sys.Links[2][0].Write = P2PNotSupported
	var b strings.Builder
	if err := WriteTopology(&b, sys); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"Link  GPU0  GPU1  GPU2\n" +
		"GPU0  X     NV2   SYS\n" +
		"GPU1  NV2   X     SYS\n" +
		"GPU2  SYS   ?     X\n" +
		"\n" +
		"P2P r/w  GPU0   GPU1  GPU2\n" +
		"GPU0     X      OK    TNS\n" +
		"GPU1     OK     X     TNS\n" +
		"GPU2     OK/NS  TNS   X\n"
	got := b.String()
	if !strings.HasPrefix(got, want) {
		t.Errorf("WriteTopology:\n%s\nwant it to start with:\n%s", got, want)
	}
	if !strings.Contains(got, "NV# = # bonded NVLinks") || !strings.Contains(got, "TNS = topology not supported") {
		t.Errorf("WriteTopology has no legend:\n%s", got)
	}
}

func TestWriteTopologyPrintsNothingForOneGPU(t *testing.T) {
	var b strings.Builder
	if err := WriteTopology(&b, &System{GPUs: []GPU{{Name: "T4"}}}); err != nil || b.Len() != 0 {
		t.Errorf("WriteTopology = %q, %v; want nothing", b.String(), err)
	}
}

func TestNVLinkCountingStopsAtTheLastLink(t *testing.T) {
	f := pcieBox()
	if _, err := Discover(f); err != nil {
		t.Fatal(err)
	}
	asked := map[string]bool{}
	for _, c := range f.calls {
		asked[c] = true
	}
	// GPU0 has two links: link 2 answers an error, and nothing past it is asked.
	if !asked["NVLinkActive 0 2"] || asked["NVLinkActive 0 3"] {
		t.Errorf("calls = %q; want links asked up to the first error only", f.calls)
	}
	// GPU2 has no NVLink: NVML says so at link 0.
	if !asked["NVLinkActive 2 0"] || asked["NVLinkActive 2 1"] {
		t.Errorf("calls = %q; want GPU2 asked about link 0 only", f.calls)
	}
}

func TestNormalBusID(t *testing.T) {
	for _, pair := range [][2]string{
		{"00000000:3B:00.0", "0000:3b:00.0"},
		{"00000001:3B:00.0", "0001:3b:00.0"},
	} {
		if normalBusID(pair[0]) != normalBusID(pair[1]) {
			t.Errorf("%q and %q should be the same bus", pair[0], pair[1])
		}
	}
	if normalBusID("00000000:3B:00.0") == normalBusID("00000001:3B:00.0") {
		t.Error("different domains compare equal")
	}
}
