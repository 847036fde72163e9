package main

import (
	"os"

	"github.com/gorun/gorun/cuda/nvml"
)

// visibleGPUs counts the GPUs this node's workers may use, for
// --nproc-per-node gpu and auto: NVML's devices, narrowed by
// CUDA_VISIBLE_DEVICES as CUDA narrows them.
func visibleGPUs() (int, error) {
	return nvml.CountVisible(nvml.New(), os.LookupEnv)
}
