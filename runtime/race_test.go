//go:build race

package runtime

// raceEnabled: the race detector's bookkeeping allocates, so allocation
// counts mean nothing under it.
const raceEnabled = true
