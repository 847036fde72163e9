package runtime

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
)

func TestNewGroupMembership(t *testing.T) {
	onRanks(t, 4, func(world *ProcessGroup) error {
		ctx := t.Context()
		g, err := world.NewGroup(ctx, []int{3, 0, 2}) // order does not matter
		if err != nil {
			return err
		}
		if err := expect("Ranks", g.Ranks(), []int{0, 2, 3}); err != nil {
			return err
		}
		if world.Rank() == 1 {
			if g.IsMember() || g.Rank() != -1 {
				return fmt.Errorf("rank 1 is a member: %s", g)
			}
			if err := g.AllReduce(ctx, Of([]float32{1}), Sum); !errors.Is(err, ErrNotMember) {
				return fmt.Errorf("all_reduce on a group we are not in: %v", err)
			}
			if err := g.Send(ctx, Of([]float32{1}), 0, 0); !errors.Is(err, ErrNotMember) {
				return fmt.Errorf("send on a group we are not in: %v", err)
			}
			if _, err := g.NewGroup(ctx, []int{0}); !errors.Is(err, ErrNotMember) {
				return fmt.Errorf("new_group of a group we are not in: %v", err)
			}
			return nil
		}
		wantRank := map[int]int{0: 0, 2: 1, 3: 2}[world.Rank()]
		if !g.IsMember() || g.Rank() != wantRank || g.Size() != 3 {
			return fmt.Errorf("got %s, want rank %d of 3", g, wantRank)
		}
		if r, ok := g.GroupRank(3); r != 2 || !ok {
			return fmt.Errorf("GroupRank(3) = %d, %v", r, ok)
		}
		if r, ok := g.GroupRank(1); ok {
			return fmt.Errorf("GroupRank(1) = %d, true", r)
		}
		if g.GlobalRank(1) != 2 || g.GlobalRank(3) != -1 {
			return fmt.Errorf("GlobalRank(1) = %d, GlobalRank(3) = %d", g.GlobalRank(1), g.GlobalRank(3))
		}
		x := []int64{int64(world.Rank())}
		if err := g.AllReduce(ctx, Of(x), Sum); err != nil {
			return err
		}
		return expect("sum over {0,2,3}", x, []int64{5})
	})
}

func TestNewGroupDisagreementFailsEveryRank(t *testing.T) {
	onRanks(t, 4, func(world *ProcessGroup) error {
		ctx := t.Context()
		ranks := []int{0, 1}
		if world.Rank() == 2 {
			ranks = []int{0, 2}
		}
		_, err := world.NewGroup(ctx, ranks)
		if !errors.Is(err, collective.ErrMismatch) || !strings.Contains(err.Error(), "ranks passed different arguments (ranks [0 1 3] vs [2])") {
			return fmt.Errorf("got %v, want a mismatch naming the camps", err)
		}
		_, err = world.NewGroup(ctx, []int{1, 1})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "rank 1 listed twice") {
			return fmt.Errorf("duplicate rank: %v", err)
		}
		_, err = world.NewGroup(ctx, []int{0, 4})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "rank 4 is not in the parent group") {
			return fmt.Errorf("stranger: %v", err)
		}
		// Still in step.
		return world.Barrier(ctx)
	})
}

func TestSplit(t *testing.T) {
	onRanks(t, 5, func(world *ProcessGroup) error {
		ctx := t.Context()
		// By parity, reversed: the key puts higher ranks first.
		g, err := world.Split(ctx, world.Rank()%2, -world.Rank())
		if err != nil {
			return err
		}
		want := [][]int{{4, 2, 0}, {3, 1}}[world.Rank()%2]
		if err := expect("Ranks", g.Ranks(), want); err != nil {
			return err
		}
		if g.Rank() != slices.Index(want, world.Rank()) {
			return fmt.Errorf("rank %d in %v", g.Rank(), want)
		}
		x := []int32{int32(world.Rank())}
		if err := g.AllReduce(ctx, Of(x), Sum); err != nil {
			return err
		}
		if err := expect("sum", x, []int32{[]int32{6, 4}[world.Rank()%2]}); err != nil {
			return err
		}

		// A negative color opts out; equal keys keep the parent's order.
		color := 0
		if world.Rank() == 3 {
			color = -1
		}
		h, err := world.Split(ctx, color, 0)
		if err != nil {
			return err
		}
		if world.Rank() == 3 {
			if h.IsMember() {
				return errors.New("a negative color made a member")
			}
			return nil
		}
		if err := expect("Ranks", h.Ranks(), []int{0, 1, 2, 4}); err != nil {
			return err
		}
		// Groups of groups.
		inner, err := h.NewGroup(ctx, []int{1, 4})
		if err != nil {
			return err
		}
		if inner.IsMember() != (world.Rank() == 1 || world.Rank() == 4) {
			return fmt.Errorf("inner group %s", inner)
		}
		return nil
	})
}

func TestCloseClosesSubgroups(t *testing.T) {
	onRanks(t, 2, func(world *ProcessGroup) error {
		g, err := world.NewGroup(t.Context(), []int{0, 1})
		if err != nil {
			return err
		}
		if err := world.Close(); err != nil {
			return err
		}
		if err := g.Barrier(t.Context()); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("barrier on a subgroup of a closed world: %v", err)
		}
		return nil
	})
}
