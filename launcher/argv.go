package launcher

import (
	"slices"
	"strings"
)

// DefaultPython is the interpreter Argv uses when none is given.
const DefaultPython = "python3"

// Argv builds the command line for the user's program as torchrun does: a
// program ending in ".py" runs as [python, "-u", program, args...];
// module=true runs [python, "-u", "-m", program, args...]; noPython=true (which
// wins over module) and any other program run directly as [program, args...].
// "-u" keeps Python's stdout unbuffered so that lines reach the console as
// they are printed. python is the interpreter ("" means DefaultPython).
func Argv(program string, args []string, python string, module, noPython bool) []string {
	if python == "" {
		python = DefaultPython
	}
	var head []string
	switch {
	case noPython:
		head = []string{program}
	case module:
		head = []string{python, "-u", "-m", program}
	case strings.HasSuffix(program, ".py"):
		head = []string{python, "-u", program}
	default:
		head = []string{program}
	}
	return slices.Concat(head, args)
}
