// Package launcher is HOW gorun's workers run: it builds their command line
// and torchrun's environment contract, starts each worker in its own process
// group, signals and stops whole groups (signal, grace, SIGKILL, bounded
// wait), reports every exit, and multiplexes worker output into one console
// with rank prefixes or into per-rank log files.
//
// WHEN workers start, restart or stop is the agent's business (package
// elastic); nothing here keeps policy.
//
// Orphans: a worker dies with the agent (PR_SET_PDEATHSIG), but the worker's
// own children would survive it. A Keeper, a tiny guardian process per agent,
// SIGKILLs every recorded process group when the agent goes away, even by
// kill -9. gorun, like mpirun, never leaves a worker's children behind: when a
// worker is reaped, whatever is left in its process group is killed. A
// process that leaves its group (setsid, setpgid) escapes both; only a cgroup
// could hold it.
//
// Starting and reaping processes is Linux-only (sys_linux.go): it relies on
// PR_SET_PDEATHSIG and waitid(WNOWAIT).
package launcher
