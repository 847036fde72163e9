package nvml

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Level is the closest PCIe ancestor two GPUs share. Its values are NVML's
// nvmlGpuTopologyLevel_t, so an adapter converts by a plain cast.
type Level int

const (
	LevelBoard      Level = 0  // on the same board (NVML_TOPOLOGY_INTERNAL)
	LevelSingle     Level = 10 // at most one PCIe switch between them
	LevelMultiple   Level = 20 // several PCIe switches, no host bridge
	LevelHostBridge Level = 30 // through a PCIe host bridge (the CPU)
	LevelNode       Level = 40 // across host bridges of one NUMA node
	LevelSystem     Level = 50 // across NUMA nodes (QPI/UPI)
	LevelUnknown    Level = -1 // NVML did not say
)

// String is the nvidia-smi topo -m name of the level.
func (l Level) String() string {
	switch l {
	case LevelBoard:
		return "BRD"
	case LevelSingle:
		return "PIX"
	case LevelMultiple:
		return "PXB"
	case LevelHostBridge:
		return "PHB"
	case LevelNode:
		return "NODE"
	case LevelSystem:
		return "SYS"
	}
	return "?"
}

// P2PCap is the kind of peer-to-peer access asked about; its values are
// NVML's nvmlGpuP2PCapsIndex_t.
type P2PCap int

const (
	P2PRead   P2PCap = 0
	P2PWrite  P2PCap = 1
	P2PNVLink P2PCap = 2
)

// P2PStatus is NVML's answer about peer-to-peer access; its values are
// NVML's nvmlGpuP2PStatus_t.
type P2PStatus int

const (
	P2POK                   P2PStatus = 0
	P2PChipsetNotSupported  P2PStatus = 1
	P2PGPUNotSupported      P2PStatus = 2
	P2PTopologyNotSupported P2PStatus = 3
	P2PDisabledByRegkey     P2PStatus = 4
	P2PNotSupported         P2PStatus = 5
	P2PUnknown              P2PStatus = 6
)

// String is the nvidia-smi topo -p2p code of the status.
func (s P2PStatus) String() string {
	switch s {
	case P2POK:
		return "OK"
	case P2PChipsetNotSupported:
		return "CNS"
	case P2PGPUNotSupported:
		return "GNS"
	case P2PTopologyNotSupported:
		return "TNS"
	case P2PDisabledByRegkey:
		return "DIS"
	case P2PNotSupported:
		return "NS"
	}
	return "U"
}

// Link is how one GPU reaches another.
type Link struct {
	Level Level
	// NVLinks counts the active NVLinks the first GPU uses to reach the
	// second: those wired straight to it, or, when they meet through
	// NVSwitches, all its links to switches. 0: none.
	NVLinks     int
	Read, Write P2PStatus
}

// links asks NVML how every pair of devices is connected. gpus carries
// their bus ids, which tell a link to a peer from a link to an NVSwitch.
func links(devices []Device, gpus []GPU) [][]Link {
	if len(devices) < 2 {
		return nil
	}
	isGPU := map[string]bool{}
	for _, g := range gpus {
		if g.BusID != "" {
			isGPU[normalBusID(g.BusID)] = true
		}
	}
	remotes := make([][]string, len(devices))
	for i, d := range devices {
		remotes[i] = activeNVLinks(d)
	}
	out := make([][]Link, len(devices))
	for i, d := range devices {
		out[i] = make([]Link, len(devices))
		for j, peer := range devices {
			if i == j {
				continue
			}
			l := Link{Level: LevelUnknown, Read: P2PUnknown, Write: P2PUnknown}
			if lvl, err := d.CommonAncestor(peer); err == nil {
				l.Level = lvl
			}
			if s, err := d.P2PStatus(peer, P2PRead); err == nil {
				l.Read = s
			}
			if s, err := d.P2PStatus(peer, P2PWrite); err == nil {
				l.Write = s
			}
			l.NVLinks = nvlinksBetween(d, peer, remotes[i], gpus[j].BusID, isGPU)
			out[i][j] = l
		}
	}
	return out
}

// activeNVLinks returns the far end's bus id of each active link of d
// ("" where NVML does not say). NVML answers an error past the last link.
func activeNVLinks(d Device) []string {
	var remotes []string
	for link := range MaxNVLinks {
		up, err := d.NVLinkActive(link)
		if err != nil {
			break
		}
		if !up {
			continue
		}
		remote, err := d.NVLinkRemoteBusID(link)
		if err != nil {
			remote = ""
		}
		remotes = append(remotes, normalBusID(remote))
	}
	return remotes
}

// nvlinksBetween counts the links of d that reach peer: wired to its bus
// id, or, when NVML says the two talk over NVLink without a direct wire,
// every link of d that ends at an NVSwitch rather than a GPU.
func nvlinksBetween(d, peer Device, remotes []string, peerBusID string, isGPU map[string]bool) int {
	if len(remotes) == 0 {
		return 0
	}
	direct := 0
	for _, r := range remotes {
		if r != "" && r == normalBusID(peerBusID) {
			direct++
		}
	}
	if direct > 0 {
		return direct
	}
	if s, err := d.P2PStatus(peer, P2PNVLink); err != nil || s != P2POK {
		return 0
	}
	switched := 0
	for _, r := range remotes {
		if !isGPU[r] {
			switched++
		}
	}
	return switched
}

// normalBusID makes bus ids comparable: NVML writes the domain with 8 or 4
// hex digits depending on the call, in either case.
func normalBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	if domain, rest, ok := strings.Cut(id, ":"); ok && strings.Count(id, ":") == 2 {
		return strings.TrimLeft(domain, "0") + ":" + rest
	}
	return id
}

// WriteTopology prints sys.Links as two matrices, the way nvidia-smi topo
// -m and topo -p2p do: how each pair is connected, then whether each may
// read and write the other's memory directly. It prints nothing with fewer
// than two GPUs.
func WriteTopology(w io.Writer, sys *System) error {
	if len(sys.Links) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	matrix := func(title string, cell func(l Link) string) {
		fmt.Fprintf(tw, "%s", title)
		for _, g := range sys.GPUs {
			fmt.Fprintf(tw, "\tGPU%d", g.Index)
		}
		fmt.Fprintln(tw)
		for i, row := range sys.Links {
			fmt.Fprintf(tw, "GPU%d", sys.GPUs[i].Index)
			for j, l := range row {
				c := "X"
				if i != j {
					c = cell(l)
				}
				fmt.Fprintf(tw, "\t%s", c)
			}
			fmt.Fprintln(tw)
		}
	}
	matrix("Link", func(l Link) string {
		if l.NVLinks > 0 {
			return fmt.Sprintf("NV%d", l.NVLinks)
		}
		return l.Level.String()
	})
	fmt.Fprintln(tw)
	matrix("P2P r/w", func(l Link) string {
		if l.Read == l.Write {
			return l.Read.String()
		}
		return l.Read.String() + "/" + l.Write.String()
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, topologyLegend)
	return err
}

const topologyLegend = `Link: X = self, NV# = # bonded NVLinks (through NVSwitches: all of the GPU's links),
  PIX = at most one PCIe switch, PXB = several PCIe switches, PHB = through a PCIe host bridge (CPU),
  NODE = across host bridges within a NUMA node, SYS = across NUMA nodes, BRD = same board, ? = unknown.
P2P r/w: direct peer reads/writes (one code when both agree, else read/write): OK, CNS = chipset not supported,
  GNS = GPU not supported, TNS = topology not supported, DIS = disabled by registry key, NS = not supported, U = unknown.
`
