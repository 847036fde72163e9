package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gorun/gorun/cuda"
	dist "github.com/gorun/gorun/runtime"
)

// checkWatchdog is -watchdog: the last rank holds back from an all_reduce
// of a device tensor, as a rank stuck elsewhere would, so the others'
// NCCL kernels wait for it; each of them must abort its communicator
// when the group's timeout ends, with an error that names the operation
// and the rank, and then still reach the held-back rank over the host.
func checkWatchdog(ctx context.Context, pg *dist.ProcessGroup, timeout time.Duration, stdout, stderr io.Writer) error {
	if pg.Size() < 2 {
		return errors.New("-watchdog needs two ranks or more")
	}
	if pg.Backend() != "nccl" {
		return fmt.Errorf("-watchdog needs the nccl backend, not %s", pg.Backend())
	}
	x, err := dist.NewDeviceTensor(pg.Device(), dist.Float32, 1<<10)
	if err != nil {
		return err
	}
	defer x.DeviceBuffer().Free()
	held := pg.Size() - 1
	var bad error
	if pg.Rank() == held {
		// Past the others' timeout, and well within their next one.
		time.Sleep(timeout * 3 / 2)
	} else {
		start := time.Now()
		err := pg.AllReduce(ctx, x, dist.Sum)
		if bad = abortedAsWanted(err, "all_reduce", pg.Rank()); bad == nil {
			fmt.Fprintf(stdout, "gpucheck: rank %d: aborted after %v: %v\n", pg.Rank(), time.Since(start).Round(time.Millisecond), err)
		}
	}
	if bad != nil {
		fmt.Fprintf(stderr, "gpucheck: rank %d: watchdog: %v\n", pg.Rank(), bad)
	}
	failing, err := failingRanks(ctx, pg, bad != nil)
	if err != nil {
		return fmt.Errorf("over the host after the abort: %w", err)
	}
	if failing > 0 {
		return fmt.Errorf("watchdog: %d of %d ranks did not abort as they should (their errors are above)", failing, held)
	}
	if pg.Rank() == 0 {
		fmt.Fprintf(stdout, "PASS  watchdog: %d ranks aborted the all_reduce rank %d held back from after %v, and reached it over the host\n", held, held, timeout)
	}
	return nil
}

// abortedAsWanted says what is wrong with err, the error of op on rank
// when the watchdog must have aborted its communicator: nil when it did,
// naming the operation and the rank.
func abortedAsWanted(err error, op string, rank int) error {
	var opErr *cuda.OpError
	switch {
	case err == nil:
		return fmt.Errorf("%s finished, though a rank held back from it", op)
	case !errors.Is(err, cuda.ErrAborted):
		return fmt.Errorf("%s failed, but its communicator was not aborted: %w", op, err)
	case !errors.As(err, &opErr) || opErr.Op != op || opErr.Rank != rank || !opErr.Aborted:
		return fmt.Errorf("the abort does not name %s on rank %d: %w", op, rank, err)
	case !errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s was aborted, but not at the timeout: %w", op, err)
	}
	return nil
}
