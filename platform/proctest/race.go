//go:build race

package proctest

// raceEnabled: the tests run with -race, so Build builds the binaries with
// it too.
const raceEnabled = true
