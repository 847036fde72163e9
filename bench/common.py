"""What every bench script shares: where the repository and the Python
with torch are, the measurement conventions of nccl-tests, logging, and
the environment mpirun needs."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.environ.get("GORUN_BENCH_PYTHON", "/usr/bin/python3")

# nccl-tests' bus bandwidth factors, by world size n.
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}
# Collectives whose SIZE is split over the ranks.
PER_RANK = {"allgather", "reduce_scatter", "alltoall"}


def elements(op, size, world):
    """The float32 elements of a SIZE-byte buffer: rounded down to a
    multiple of the world size, at least one per rank, where SIZE is split
    over the ranks."""
    count = max(size // 4, 1)
    if op in PER_RANK:
        count = max(count - count % world, world)
    return count


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def mpi_env(**extra):
    """os.environ plus extra; mpirun refuses to run as root unless told twice."""
    env = dict(os.environ, **extra)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env
