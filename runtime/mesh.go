package runtime

import (
	"context"
	"fmt"
	"slices"
)

// DeviceMesh lays the ranks of a group out in an N-dimensional array, row
// major, as torch's init_device_mesh does, and gives every dimension its
// groups: along dimension d, the ranks whose coordinates differ only in d
// form a group. In a 2x3 mesh of ranks 0..5 named ("dp", "tp"), the "tp"
// groups are {0,1,2} and {3,4,5}, the "dp" groups {0,3}, {1,4} and {2,5}.
type DeviceMesh struct {
	shape  []int
	names  []string
	coord  []int           // this rank's coordinates
	groups []*ProcessGroup // this rank's group along each dimension
}

// NewDeviceMesh lays out the ranks of pg in a mesh of the given shape,
// whose dimensions are named dimNames; the product of shape must be
// pg.Size(). Every rank of pg calls it with the same arguments; ranks that
// do not all get an error wrapping collective.ErrMismatch. The mesh's
// groups close with pg.
func NewDeviceMesh(ctx context.Context, pg *ProcessGroup, shape []int, dimNames []string) (*DeviceMesh, error) {
	m := &DeviceMesh{shape: slices.Clone(shape), names: slices.Clone(dimNames)}
	err := pg.collective(ctx, "device_mesh", nil, func(ctx context.Context) error {
		// Agree first: ranks that passed different meshes must all fail,
		// not some of them fail a check and the others wait for them.
		if err := pg.agree(ctx, m.shape, m.names); err != nil {
			return err
		}
		if err := checkMesh(pg.Size(), m.shape, m.names); err != nil {
			return err
		}
		for d := range m.shape {
			g, err := pg.partition(ctx, meshGroups(m.shape, d))
			if err != nil {
				for _, g := range m.groups {
					g.Close()
				}
				return err
			}
			m.groups = append(m.groups, g)
		}
		return nil
	}).Wait(ctx)
	if err != nil {
		return nil, err // the operation may still be running: leave m to it
	}
	m.coord = unravel(pg.Rank(), m.shape)
	return m, nil
}

func checkMesh(size int, shape []int, names []string) error {
	if len(shape) == 0 {
		return invalid("mesh has no dimensions")
	}
	if len(names) != len(shape) {
		return invalid("mesh has %d dimensions but %d names", len(shape), len(names))
	}
	product := 1
	for d, n := range shape {
		if n <= 0 {
			return invalid("mesh dimension %q has size %d", names[d], n)
		}
		product *= n
	}
	if product != size {
		return invalid("mesh %v holds %d ranks, but the group has %d", shape, product, size)
	}
	for d, name := range names {
		if name == "" || slices.Index(names, name) != d {
			return invalid("mesh dimension names %q are not distinct and non-empty", names)
		}
	}
	return nil
}

// meshGroups returns the groups along dimension d of a row-major mesh of
// shape, in the order of their first ranks.
func meshGroups(shape []int, d int) [][]int {
	stride, size := 1, 1
	for i, n := range shape {
		size *= n
		if i > d {
			stride *= n
		}
	}
	var groups [][]int
	for first := range size {
		if unravel(first, shape)[d] != 0 {
			continue
		}
		group := make([]int, shape[d])
		for k := range group {
			group[k] = first + k*stride
		}
		groups = append(groups, group)
	}
	return groups
}

// unravel returns the coordinates of index in a row-major array of shape.
func unravel(index int, shape []int) []int {
	coord := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		coord[d] = index % shape[d]
		index /= shape[d]
	}
	return coord
}

// Group returns this rank's group along dimension dim.
func (m *DeviceMesh) Group(dim string) *ProcessGroup { return m.groups[m.dim(dim)] }

// LocalRank returns this rank's coordinate along dimension dim, which is
// its rank in Group(dim).
func (m *DeviceMesh) LocalRank(dim string) int { return m.coord[m.dim(dim)] }

// Size returns the length of dimension dim.
func (m *DeviceMesh) Size(dim string) int { return m.shape[m.dim(dim)] }

// Coordinate returns this rank's coordinates in the mesh.
func (m *DeviceMesh) Coordinate() []int { return slices.Clone(m.coord) }

// Shape returns the length of every dimension.
func (m *DeviceMesh) Shape() []int { return slices.Clone(m.shape) }

// DimNames returns the name of every dimension.
func (m *DeviceMesh) DimNames() []string { return slices.Clone(m.names) }

// dim returns the index of the dimension named name. An unknown name is a
// programming error, and panics, as an index out of range does.
func (m *DeviceMesh) dim(name string) int {
	d := slices.Index(m.names, name)
	if d < 0 {
		panic(fmt.Sprintf("runtime: device mesh has no dimension %q; it has %q", name, m.names))
	}
	return d
}
