package runtime

import (
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

func TestMonitoredBarrier(t *testing.T) {
	onRanks(t, 4, func(pg *ProcessGroup) error {
		for range 3 {
			if err := pg.MonitoredBarrier(t.Context(), time.Minute, true); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestMonitoredBarrierNamesMissingRanks(t *testing.T) {
	for _, tc := range []struct {
		absent  []int
		waitAll bool
		want    string
	}{
		{[]int{2, 5}, true, "runtime: monitored_barrier: ranks [2 5] did not arrive within 3s"},
		{[]int{2, 5}, false, "runtime: monitored_barrier: rank 2 did not arrive within 3s"},
		{[]int{0}, true, "runtime: monitored_barrier: rank 0 did not arrive within 3s"},
	} {
		t.Run(fmt.Sprint(tc.absent, tc.waitAll), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				onRanks(t, 6, func(pg *ProcessGroup) error {
					for _, r := range tc.absent {
						if pg.Rank() == r {
							return nil
						}
					}
					err := pg.MonitoredBarrier(t.Context(), 3*time.Second, tc.waitAll)
					var be *BarrierError
					if err == nil || err.Error() != tc.want || !errors.As(err, &be) {
						return fmt.Errorf("got %v, want %q", err, tc.want)
					}
					return nil
				})
			})
		})
	}
}
