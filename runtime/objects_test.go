package runtime

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
)

type checkpoint struct {
	Step    int
	Name    string
	Weights map[string][]float64
}

func checkpointOf(rank int) checkpoint {
	return checkpoint{
		Step:    100 * rank,
		Name:    strings.Repeat("r", rank+1), // sizes differ per rank
		Weights: map[string][]float64{"w": {float64(rank), 0.5}},
	}
}

func TestObjectCollectives(t *testing.T) {
	onRanks(t, 3, func(pg *ProcessGroup) error {
		ctx := t.Context()
		rank, size := pg.Rank(), pg.Size()

		v := checkpointOf(rank)
		if err := BroadcastObject(ctx, pg, &v, 2); err != nil {
			return err
		}
		if !reflect.DeepEqual(v, checkpointOf(2)) {
			return fmt.Errorf("broadcast_object: %+v", v)
		}

		all, err := AllGatherObject(ctx, pg, checkpointOf(rank))
		if err != nil {
			return err
		}
		gathered, err := GatherObject(ctx, pg, checkpointOf(rank), 1)
		if err != nil {
			return err
		}
		if rank != 1 && gathered != nil {
			return fmt.Errorf("gather_object on a non-root: %v", gathered)
		}
		for r := range size {
			if !reflect.DeepEqual(all[r], checkpointOf(r)) {
				return fmt.Errorf("all_gather_object[%d]: %+v", r, all[r])
			}
			if rank == 1 && !reflect.DeepEqual(gathered[r], checkpointOf(r)) {
				return fmt.Errorf("gather_object[%d]: %+v", r, gathered[r])
			}
		}

		var plans []map[string]int
		if rank == 0 {
			plans = []map[string]int{{"a": 0}, {"b": 1, "bb": 11}, {}}
		}
		plan, err := ScatterObject(ctx, pg, plans, 0)
		if err != nil {
			return err
		}
		want := []map[string]int{{"a": 0}, {"b": 1, "bb": 11}, {}}[rank]
		if !maps.Equal(plan, want) {
			return fmt.Errorf("scatter_object: %v, want %v", plan, want)
		}
		return nil
	})
}

func TestObjectThatCannotBeEncodedFailsEveryRank(t *testing.T) {
	onRanks(t, 3, func(pg *ProcessGroup) error {
		ctx := t.Context()
		value := any(pg.Rank())
		if pg.Rank() == 1 {
			value = func() {} // gob cannot encode functions
		}
		_, err := AllGatherObject(ctx, pg, value)
		switch {
		case err == nil:
			return errors.New("all_gather_object of a function succeeded")
		case pg.Rank() != 1 && !strings.Contains(err.Error(), "runtime: all_gather_object: ranks [1] could not encode their values"):
			return fmt.Errorf("all_gather_object: %v", err)
		}

		var in []int
		if pg.Rank() == 0 {
			in = []int{1, 2} // one short
		}
		_, err = ScatterObject(ctx, pg, in, 0)
		switch {
		case pg.Rank() == 0 && !errors.Is(err, ErrInvalidArgument):
			return fmt.Errorf("scatter_object with a short list on root: %v", err)
		case pg.Rank() != 0 && !strings.Contains(fmt.Sprint(err), "ranks [0] could not encode"):
			return fmt.Errorf("scatter_object with a short list on root: %v", err)
		}
		// The group is still in step.
		return pg.Barrier(ctx)
	})
}
