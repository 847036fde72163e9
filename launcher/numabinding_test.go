package launcher

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// twoNodes is a machine of 2 NUMA nodes on 2 sockets, 4 CPUs each, with
// an L3 cache per 2 CPUs.
func twoNodes() []cpuPlace {
	var cpus []cpuPlace
	for c := range 8 {
		cpus = append(cpus, cpuPlace{cpu: c, node: c / 4, socket: c / 4, l3: c / 2})
	}
	return cpus
}

func TestPlanNUMA(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     Binding
		cpus     []cpuPlace
		gpuNodes []int
		n        int
		want     [][]int
		wantErr  string
	}{
		{"node, by GPU", BindGPUNode, twoNodes(), []int{1, 0}, 2, [][]int{{4, 5, 6, 7}, {0, 1, 2, 3}}, ""},
		{"node, no GPU: ranks share nodes in blocks", BindGPUNode, twoNodes(), nil, 4,
			[][]int{{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7}, {4, 5, 6, 7}}, ""},
		{"node, more ranks than GPUs", BindGPUNode, twoNodes(), []int{1}, 2, [][]int{{4, 5, 6, 7}, {4, 5, 6, 7}}, ""},
		{"socket", BindGPUSocket, twoNodes(), []int{0, 1}, 2, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, ""},
		{"exclusive: shares of the node", BindGPUExclusive, twoNodes(), []int{0, 0, 1, 1}, 4,
			[][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, ""},
		{"exclusive: uneven", BindGPUExclusive, twoNodes(), []int{0, 0, 0}, 3, [][]int{{0}, {1}, {2, 3}}, ""},
		{"exclusive: more ranks than CPUs", BindGPUExclusive, twoNodes()[:2], []int{0, 0, 0}, 3, [][]int{{0}, {1}, {0}}, ""},
		{"core-complex: L3 caches in turn", BindGPUCoreComplex, twoNodes(), []int{0, 0, 0, 1}, 4,
			[][]int{{0, 1}, {2, 3}, {0, 1}, {4, 5}}, ""},
		{"GPU on a node we may not use", BindGPUNode, twoNodes()[:4], []int{1}, 1, nil, "NUMA node 1"},
		{"no CPU", BindGPUNode, nil, nil, 1, nil, "no CPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planNUMA(tc.mode, tc.cpus, tc.gpuNodes, tc.n)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// topology reads CPUs, caches and NVIDIA GPUs from a /sys tree.
func TestTopology(t *testing.T) {
	root := t.TempDir()
	write := func(path, s string) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("devices/system/node/node0/cpulist", "0-1")
	write("devices/system/node/node1/cpulist", "2-3")
	for c, socket := range []string{"0", "0", "1", "1"} {
		dir := "devices/system/cpu/cpu" + string(rune('0'+c))
		write(dir+"/topology/physical_package_id", socket)
		write(dir+"/cache/index3/id", socket)
	}
	write("bus/pci/devices/0000:41:00.0/vendor", "0x10de")
	write("bus/pci/devices/0000:41:00.0/class", "0x030200")
	write("bus/pci/devices/0000:41:00.0/numa_node", "1")
	write("bus/pci/devices/0000:01:00.0/vendor", "0x10de")
	write("bus/pci/devices/0000:01:00.0/class", "0x030000")
	write("bus/pci/devices/0000:01:00.0/numa_node", "-1") // unknown: node 0
	write("bus/pci/devices/0000:02:00.0/vendor", "0x10de")
	write("bus/pci/devices/0000:02:00.0/class", "0x040300") // audio
	write("bus/pci/devices/0000:03:00.0/vendor", "0x15b3")
	write("bus/pci/devices/0000:03:00.0/class", "0x020700")
	cpus, gpus, err := topology(root, []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	wantCPUs := []cpuPlace{{1, 0, 0, 0}, {2, 1, 1, 1}, {3, 1, 1, 1}}
	if !reflect.DeepEqual(cpus, wantCPUs) || !reflect.DeepEqual(gpus, []int{0, 1}) {
		t.Errorf("got %v %v; want %v [0 1]", cpus, gpus, wantCPUs)
	}
}

func TestParseNUMABinding(t *testing.T) {
	for in, want := range map[string]Binding{"node": BindGPUNode, "Socket": BindGPUSocket, "exclusive": BindGPUExclusive, "core-complex": BindGPUCoreComplex} {
		if got, err := ParseNUMABinding(in); err != nil || got != want {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	if _, err := ParseNUMABinding("core"); err == nil {
		t.Error(`"core" accepted`)
	}
}
