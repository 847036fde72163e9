package elastic

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/gorun/gorun/rendezvous"
)

// roleInfo is what each agent publishes about itself, in torchelastic's
// JSON shape, so that every agent can derive the same global ranks.
type roleInfo struct {
	Role           string `json:"role"`
	Rank           int    `json:"rank"`
	LocalWorldSize int    `json:"local_world_size"`
}

// ranks says where this node's workers sit in the job.
type ranks struct {
	GroupRank, GroupWorldSize int
	BaseRank, WorldSize       int
	BaseRoleRank, RoleSize    int
}

// assignRanks publishes this node's role info in the round's store and reads
// every node's, so that global ranks are contiguous per node in group-rank
// order (torchelastic's _assign_worker_ranks), whatever each node's nproc.
func assignRanks(ctx context.Context, store rendezvous.Store, groupRank, groupWorldSize int, role string, nproc int) (ranks, error) {
	me, err := json.Marshal(roleInfo{Role: role, Rank: groupRank, LocalWorldSize: nproc})
	if err != nil {
		return ranks{}, err
	}
	if err := store.Set(ctx, roleInfoKey(groupRank), me); err != nil {
		return ranks{}, fmt.Errorf("publish role info: %w", err)
	}
	keys := make([]string, groupWorldSize)
	for i := range keys {
		keys[i] = roleInfoKey(i)
	}
	values, err := store.MultiGet(ctx, keys)
	if err != nil {
		return ranks{}, fmt.Errorf("read role info of %d nodes: %w", groupWorldSize, err)
	}
	r := ranks{GroupRank: groupRank, GroupWorldSize: groupWorldSize}
	for i, v := range values {
		var info roleInfo
		if err := json.Unmarshal(v, &info); err != nil {
			return ranks{}, fmt.Errorf("role info of node %d: %w", i, err)
		}
		if i < groupRank {
			r.BaseRank += info.LocalWorldSize
		}
		r.WorldSize += info.LocalWorldSize
		if info.Role == role {
			if i < groupRank {
				r.BaseRoleRank += info.LocalWorldSize
			}
			r.RoleSize += info.LocalWorldSize
		}
	}
	return r, nil
}

func roleInfoKey(groupRank int) string {
	return "torchelastic/role_info/" + strconv.Itoa(groupRank)
}
