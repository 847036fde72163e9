package nvml

import (
	"errors"
	"fmt"
	"strings"
)

// VisibleDevicesEnv is the variable CUDA narrows its devices by.
const VisibleDevicesEnv = "CUDA_VISIBLE_DEVICES"

// Visible returns the GPUs a CUDA process sees under
// CUDA_VISIBLE_DEVICES=value, in its order (entry k is cuda:k). It reads
// the list as CUDA and PyTorch do:
//   - entries are NVML indices, or GPU UUIDs ("GPU-" and enough leading
//     characters to name one GPU); the first entry decides which;
//   - the first entry that names no GPU ends the list, so "" and "-1" hide
//     every GPU, and "0,-1,1" shows only GPU0;
//   - naming a GPU twice hides every GPU.
//
// MIG devices ("MIG-...") cannot be resolved from the GPU list: they are
// an error, so that callers ask for an explicit count.
//
// The order is CUDA's when CUDA numbers devices in PCI bus order, as NVML
// does: with CUDA_DEVICE_ORDER=PCI_BUS_ID, or on a node of identical GPUs.
// The count does not depend on it.
func Visible(gpus []GPU, value string) ([]GPU, error) {
	entries := strings.Split(value, ",")
	for i := range entries {
		entries[i] = strings.TrimSpace(entries[i])
	}
	var resolve func(entry string) (int, bool)
	switch first := entries[0]; {
	case strings.HasPrefix(first, "MIG-"):
		return nil, fmt.Errorf("nvml: %s=%q names MIG devices, which gorun cannot count: give the number of workers instead", VisibleDevicesEnv, value)
	case strings.HasPrefix(first, "GPU-"):
		resolve = func(entry string) (int, bool) { return byUUIDPrefix(gpus, entry) }
	default:
		resolve = func(entry string) (int, bool) {
			n, ok := leadingOrdinal(entry)
			return n, ok && n < len(gpus)
		}
	}

	var visible []GPU
	seen := map[int]bool{}
	for _, entry := range entries {
		i, ok := resolve(entry)
		if !ok {
			break
		}
		if seen[i] {
			return nil, nil
		}
		seen[i] = true
		visible = append(visible, gpus[i])
	}
	return visible, nil
}

// leadingOrdinal reads an entry as CUDA's strtoul does: the decimal digits
// it starts with ("1gpu" is 1, "+2" is 2). A minus sign, or no digit at
// all, names no device.
func leadingOrdinal(entry string) (int, bool) {
	entry = strings.TrimPrefix(entry, "+")
	n, digits := 0, 0
	for _, c := range entry {
		if c < '0' || c > '9' || n > 1<<20 {
			break
		}
		n = 10*n + int(c-'0')
		digits++
	}
	return n, digits > 0
}

// byUUIDPrefix finds the one GPU whose UUID starts with prefix; a prefix
// that fits none, or several, names no device.
func byUUIDPrefix(gpus []GPU, prefix string) (int, bool) {
	if !strings.HasPrefix(prefix, "GPU-") {
		return 0, false
	}
	found := -1
	for i, g := range gpus {
		if strings.HasPrefix(g.UUID, prefix) {
			if found >= 0 {
				return 0, false
			}
			found = i
		}
	}
	return found, found >= 0
}

// CountVisible counts the GPUs a worker started from this environment may
// use: all NVML devices, narrowed by CUDA_VISIBLE_DEVICES when lookupEnv
// has it. It fails when NVML is unavailable, saying why.
func CountVisible(lib Library, lookupEnv func(string) (string, bool)) (int, error) {
	sys, err := Discover(lib)
	if err != nil {
		return 0, err
	}
	value, set := lookupEnv(VisibleDevicesEnv)
	if !set {
		return len(sys.GPUs), nil
	}
	visible, err := Visible(sys.GPUs, value)
	if err != nil {
		return 0, err
	}
	if len(visible) == 0 && len(sys.GPUs) > 0 {
		return 0, errors.New(HiddenBy(value, len(sys.GPUs)))
	}
	return len(visible), nil
}

// HiddenBy explains why none of n GPUs is visible under
// CUDA_VISIBLE_DEVICES=value.
func HiddenBy(value string, n int) string {
	return fmt.Sprintf("nvml: %s=%q hides all %d GPUs of this node (an empty list, -1, an unknown index or UUID first, or a GPU named twice)", VisibleDevicesEnv, value, n)
}
