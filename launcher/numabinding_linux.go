package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// torchrun's --numa-binding modes. Like torchrun, they take local rank i
// to be the worker of GPU i and bind it near that GPU: on its NUMA node.
// A rank without a GPU of its own (a CPU job, or more ranks than GPUs)
// gets a NUMA node by its share of the local ranks, ranks 0..n/k-1 the
// first of k nodes, which is how GPUs are usually attached.
const (
	// BindGPUNode binds a worker to the CPUs of its NUMA node.
	BindGPUNode Binding = "node"
	// BindGPUSocket binds a worker to the CPUs of its NUMA node's socket.
	BindGPUSocket Binding = "socket"
	// BindGPUExclusive splits a NUMA node's CPUs between the workers on
	// it: each has CPUs no other worker of the node has.
	BindGPUExclusive Binding = "exclusive"
	// BindGPUCoreComplex binds a worker to the CPUs that share one L3
	// cache in its NUMA node; the node's workers take its L3 caches in turn.
	BindGPUCoreComplex Binding = "core-complex"
)

// sysRoot is where the kernel describes CPUs, NUMA nodes and PCI devices.
const sysRoot = "/sys"

// ParseNUMABinding reads a --numa-binding value.
func ParseNUMABinding(s string) (Binding, error) {
	switch b := Binding(strings.ToLower(strings.TrimSpace(s))); b {
	case BindGPUNode, BindGPUSocket, BindGPUExclusive, BindGPUCoreComplex:
		return b, nil
	}
	return "", fmt.Errorf("%q: want node, socket, exclusive or core-complex", s)
}

// cpuPlace is where one CPU sits.
type cpuPlace struct {
	cpu, node, socket int
	l3                int // the id of its L3 cache; -1 when unknown
}

// topology reads the place of every CPU in allowed from root (a /sys),
// and the NUMA node of every NVIDIA GPU in PCI order, NVML's order.
func topology(root string, allowed []int) (cpus []cpuPlace, gpuNodes []int, err error) {
	nodes, err := numaNodes(filepath.Join(root, "devices/system/node"))
	if err != nil {
		return nil, nil, err
	}
	nodeOf := map[int]int{}
	for node, list := range nodes {
		for _, c := range list {
			nodeOf[c] = node
		}
	}
	readInt := func(path string, def int) int {
		b, err := os.ReadFile(path)
		if err != nil {
			return def
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return def
		}
		return n
	}
	for _, c := range allowed {
		dir := filepath.Join(root, "devices/system/cpu", "cpu"+strconv.Itoa(c))
		cpus = append(cpus, cpuPlace{
			cpu:    c,
			node:   nodeOf[c],
			socket: readInt(filepath.Join(dir, "topology/physical_package_id"), 0),
			l3:     readInt(filepath.Join(dir, "cache/index3/id"), -1),
		})
	}
	devices, _ := filepath.Glob(filepath.Join(root, "bus/pci/devices/*"))
	slices.Sort(devices) // bus order
	for _, d := range devices {
		vendor, _ := os.ReadFile(filepath.Join(d, "vendor"))
		class, _ := os.ReadFile(filepath.Join(d, "class"))
		// NVIDIA's display and 3D controllers (class 0x03xxxx).
		if strings.TrimSpace(string(vendor)) == "0x10de" && strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") {
			gpuNodes = append(gpuNodes, max(readInt(filepath.Join(d, "numa_node"), 0), 0))
		}
	}
	return cpus, gpuNodes, nil
}

// planNUMA lists the CPUs of each of n local ranks under mode, given the
// places of the CPUs the agent may use and the NUMA node of each GPU.
func planNUMA(mode Binding, cpus []cpuPlace, gpuNodes []int, n int) ([][]int, error) {
	var nodes []int // the NUMA nodes that have a CPU we may use, ascending
	for _, c := range cpus {
		if !slices.Contains(nodes, c.node) {
			nodes = append(nodes, c.node)
		}
	}
	slices.Sort(nodes)
	if len(nodes) == 0 {
		return nil, fmt.Errorf("this process may use no CPU")
	}
	home := make([]int, n)
	for i := range home {
		home[i] = nodes[i*len(nodes)/n]
		if i < len(gpuNodes) {
			home[i] = gpuNodes[i]
		}
	}
	where := func(keep func(cpuPlace) bool) []int {
		var out []int
		for _, c := range cpus {
			if keep(c) {
				out = append(out, c.cpu)
			}
		}
		return out
	}
	per := make([][]int, n)
	for i := range per {
		node := home[i]
		onNode := where(func(c cpuPlace) bool { return c.node == node })
		if len(onNode) == 0 {
			return nil, fmt.Errorf("local rank %d belongs on NUMA node %d, and this process may use none of its CPUs", i, node)
		}
		// The ranks that share this node, and which of them i is.
		var peers, nth int
		for j := range home {
			if home[j] == node {
				if j == i {
					nth = peers
				}
				peers++
			}
		}
		switch mode {
		case BindGPUNode:
			per[i] = onNode
		case BindGPUSocket:
			socket := -1
			for _, c := range cpus {
				if c.node == node {
					socket = c.socket
					break
				}
			}
			per[i] = where(func(c cpuPlace) bool { return c.socket == socket })
		case BindGPUExclusive:
			// Contiguous shares; with more ranks than CPUs, ranks share
			// a CPU rather than go without.
			if peers > len(onNode) {
				per[i] = []int{onNode[nth%len(onNode)]}
				break
			}
			per[i] = onNode[nth*len(onNode)/peers : (nth+1)*len(onNode)/peers]
		case BindGPUCoreComplex:
			var caches []int
			for _, c := range cpus {
				if c.node == node && !slices.Contains(caches, c.l3) {
					caches = append(caches, c.l3)
				}
			}
			l3 := caches[nth%len(caches)]
			per[i] = where(func(c cpuPlace) bool { return c.node == node && c.l3 == l3 })
		default:
			return nil, fmt.Errorf("%q is not a --numa-binding mode", mode)
		}
	}
	return per, nil
}
