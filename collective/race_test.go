//go:build race

package collective

// raceEnabled trims the heaviest test matrices, which the race detector
// slows tenfold.
const raceEnabled = true
