package elastic

import (
	"context"
	"encoding/json"
	"errors"
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
	// Left, gorun's own, says that a node left before the ranks were
	// assigned, and why (leaveRanks).
	Left string `json:"gorun_left,omitempty"`
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
// await, when set, waits until every node published its own.
func assignRanks(ctx context.Context, store rendezvous.Store, groupRank, groupWorldSize int, role string, nproc int,
	await func(ctx context.Context, keys []string) error) (ranks, error) {
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
	if await != nil {
		if err := await(ctx, keys); err != nil {
			return ranks{}, err
		}
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
		if info.Left != "" {
			return ranks{}, errors.New(info.Left)
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

// leaveRanks tells the nodes of a static job, within ctx, that this one
// left before the ranks were assigned, and why: the job cannot run without
// it. It puts why in place of every node's role info, in one request:
// those waiting in assignRanks wake and fail at once naming it, and so do
// nodes that come later (they find it beside their own), instead of
// waiting out the store's timeout, or starting workers that would wait
// for this node's.
func leaveRanks(ctx context.Context, store rendezvous.Store, groupWorldSize int, why string) error {
	left, err := json.Marshal(roleInfo{Left: why})
	if err != nil {
		return err
	}
	keys := make([]string, groupWorldSize)
	values := make([][]byte, groupWorldSize)
	for i := range keys {
		keys[i], values[i] = roleInfoKey(i), left
	}
	if err := store.MultiSet(ctx, keys, values); err != nil {
		return fmt.Errorf("elastic: tell the other nodes that this one left: %w", err)
	}
	return nil
}

func roleInfoKey(groupRank int) string {
	return "torchelastic/role_info/" + strconv.Itoa(groupRank)
}
