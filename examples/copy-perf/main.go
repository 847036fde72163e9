// Command copy-perf measures the runtime's copies between host memory
// and a GPU: a DeviceBuffer's WriteAt and ReadAt from and to a Go slice
// (pageable memory, staged through the device's pinned buffer), which is
// how the TCP backend moves device tensors and how dist.Copy fills them.
// scripts/gpu_torch_perf.py measures torch's copies, cudaMemcpy from
// pageable and from pinned memory, beside it.
//
//	copy-perf                 # GPU 0, 4 KiB to 1 GiB
//	copy-perf -gpu 1 -max 256M
//
// It prints one line per size with the time and bandwidth of each
// direction, after checking that the bytes came back unchanged, and
// exits 1 when they did not or the GPU could not be used.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gorun/gorun/cuda"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command, returning its exit status: 0 when every size was
// measured and checked, 1 when the GPU failed or a copy came back wrong,
// 2 for bad flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("copy-perf", flag.ContinueOnError)
	flags.SetOutput(stderr)
	ordinal := flags.Int("gpu", 0, "the GPU's ordinal among those the driver sees")
	maxMiB := flags.Int("max-mib", 1024, "the largest copy, in MiB (sizes go from 4 KiB up by 16x, and this one)")
	minTime := flags.Duration("time", 200*time.Millisecond, "how long each size and direction runs at least")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *maxMiB < 1 || *minTime <= 0 {
		fmt.Fprintln(stderr, "copy-perf: -max-mib and -time must be positive")
		return 2
	}
	if err := measure(ctx, *ordinal, ladder(*maxMiB<<20), *minTime, stdout); err != nil {
		fmt.Fprintln(stderr, "copy-perf:", err)
		return 1
	}
	return 0
}

// ladder is 4 KiB, 64 KiB, ... up by 16x below largest, then largest.
func ladder(largest int) []int {
	var sizes []int
	for s := 4 << 10; s < largest; s *= 16 {
		sizes = append(sizes, s)
	}
	return append(sizes, largest)
}

func measure(ctx context.Context, ordinal int, sizes []int, minTime time.Duration, stdout io.Writer) error {
	drv, err := cuda.LoadDriver(ctx, cuda.Search{LookupEnv: os.LookupEnv})
	if err != nil {
		return err
	}
	dev, err := drv.OpenDevice(ordinal)
	if err != nil {
		return err
	}
	defer dev.Close()
	fmt.Fprintf(stdout, "# copy-perf: GPU %d (%s, %s), driver %s, Go slices (pageable) through the pinned staging buffer\n",
		dev.Ordinal(), dev.Name(), dev.BusID(), drv.Path())
	fmt.Fprintf(stdout, "# %12s  %10s  %9s  %10s  %9s\n", "size (B)", "HtoD (us)", "HtoD GB/s", "DtoH (us)", "DtoH GB/s")
	for _, size := range sizes {
		buf, err := dev.Alloc(size)
		if err != nil {
			return err
		}
		up, down, err := roundTrips(buf, size, minTime)
		buf.Free()
		if err != nil {
			return fmt.Errorf("%d bytes: %w", size, err)
		}
		fmt.Fprintf(stdout, "  %12d  %10.1f  %9.2f  %10.1f  %9.2f\n", size,
			up.Seconds()*1e6, float64(size)/up.Seconds()/1e9, down.Seconds()*1e6, float64(size)/down.Seconds()/1e9)
	}
	return nil
}

// roundTrips times buf's WriteAt and ReadAt of size bytes, each repeated
// for minTime at least after one untimed copy, and checks that the bytes
// came back as they went.
func roundTrips(buf *cuda.DeviceBuffer, size int, minTime time.Duration) (up, down time.Duration, err error) {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	if up, err = timed(minTime, func() error { _, err := buf.WriteAt(src, 0); return err }); err != nil {
		return 0, 0, err
	}
	if down, err = timed(minTime, func() error { _, err := buf.ReadAt(dst, 0); return err }); err != nil {
		return 0, 0, err
	}
	if i := mismatch(src, dst); i >= 0 {
		return 0, 0, fmt.Errorf("byte %d came back as %d, went as %d", i, dst[i], src[i])
	}
	return up, down, nil
}

// timed runs once, untimed, then again as often as fits in minTime (at
// least 3 times), and returns the mean time of those runs.
func timed(minTime time.Duration, once func() error) (time.Duration, error) {
	if err := once(); err != nil {
		return 0, err
	}
	start, n := time.Now(), 0
	for n < 3 || time.Since(start) < minTime {
		if err := once(); err != nil {
			return 0, err
		}
		n++
	}
	return time.Since(start) / time.Duration(n), nil
}

// mismatch is the first index where a and b differ, or -1.
func mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
