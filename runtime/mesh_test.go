package runtime

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDeviceMesh(t *testing.T) {
	for _, tc := range []struct {
		shape  []int
		groups map[string][][]int // every group along each dimension
	}{
		{[]int{2, 2}, map[string][][]int{
			"dp": {{0, 2}, {1, 3}},
			"tp": {{0, 1}, {2, 3}},
		}},
		{[]int{2, 3}, map[string][][]int{
			"dp": {{0, 3}, {1, 4}, {2, 5}},
			"tp": {{0, 1, 2}, {3, 4, 5}},
		}},
	} {
		t.Run(fmt.Sprint(tc.shape), func(t *testing.T) {
			size := tc.shape[0] * tc.shape[1]
			onRanks(t, size, func(world *ProcessGroup) error {
				ctx := t.Context()
				m, err := NewDeviceMesh(ctx, world, tc.shape, []string{"dp", "tp"})
				if err != nil {
					return err
				}
				rank := world.Rank()
				coord := []int{rank / tc.shape[1], rank % tc.shape[1]}
				if err := expect("Coordinate", m.Coordinate(), coord); err != nil {
					return err
				}
				for d, dim := range m.DimNames() {
					g := m.Group(dim)
					var want []int
					for _, members := range tc.groups[dim] {
						if g.Rank() >= 0 && members[g.Rank()] == rank {
							want = members
						}
					}
					if err := expect(dim+" group", g.Ranks(), want); err != nil {
						return err
					}
					if m.LocalRank(dim) != coord[d] || m.Size(dim) != tc.shape[d] {
						return fmt.Errorf("%s: local rank %d, size %d", dim, m.LocalRank(dim), m.Size(dim))
					}
					x := []int64{int64(rank)}
					if err := g.AllReduce(ctx, Of(x), Sum); err != nil {
						return err
					}
					var sum int64
					for _, r := range want {
						sum += int64(r)
					}
					if err := expect(dim+" sum", x, []int64{sum}); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}

func TestDeviceMeshThreeDimensions(t *testing.T) {
	onRanks(t, 8, func(world *ProcessGroup) error {
		m, err := NewDeviceMesh(t.Context(), world, []int{2, 2, 2}, []string{"pp", "dp", "tp"})
		if err != nil {
			return err
		}
		r := world.Rank()
		for dim, stride := range map[string]int{"pp": 4, "dp": 2, "tp": 1} {
			first := r - m.LocalRank(dim)*stride
			if err := expect(dim, m.Group(dim).Ranks(), []int{first, first + stride}); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestDeviceMeshErrors(t *testing.T) {
	onRanks(t, 4, func(world *ProcessGroup) error {
		ctx := t.Context()
		for _, tc := range []struct {
			shape []int
			names []string
			want  string
		}{
			{[]int{2, 3}, []string{"a", "b"}, "mesh [2 3] holds 6 ranks, but the group has 4"},
			{[]int{4}, []string{"a", "b"}, "mesh has 1 dimensions but 2 names"},
			{[]int{2, 2}, []string{"a", "a"}, "are not distinct"},
			{[]int{4, 1, 0}, []string{"a", "b", "c"}, `mesh dimension "c" has size 0`},
		} {
			_, err := NewDeviceMesh(ctx, world, tc.shape, tc.names)
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("mesh %v %v: %v, want %q", tc.shape, tc.names, err, tc.want)
			}
		}
		m, err := NewDeviceMesh(ctx, world, []int{4}, []string{"dp"})
		if err != nil {
			return err
		}
		defer func() {
			if recover() == nil {
				t.Error("Group of an unknown dimension did not panic")
			}
		}()
		m.Group("tp")
		return nil
	})
}
