"""Collectives between emulated hosts whose link is the bottleneck: 2 or 4
network namespaces ("hosts", each with its own hostname), 2 ranks on each,
joined by a veth pair (2 hosts) or a bridge in a namespace of its own (4
hosts), every host's link shaped to --rate in both directions with
`tc qdisc ... tbf` (this kernel has no netem: rate only, no delay).

Measured, interleaved round by round (the systems in an order rotated each
round), medians over rounds, as bench/collectives.py measures them (float32,
nccl-tests' SIZE and busbw, slowest rank's mean time):
- gorun: bin/allreduce-perf under bin/gorun started in every namespace
  (--nnodes H --node-rank i, the store on host 1), each namespace with its
  own GORUN_HOST_ID; "gorun" is the automatic choice, "gorun-ALGO" each
  algorithm GORUN_ALGO can force for the collective (ALGOS below; a name
  a collective lacks falls back to the automatic choice).
- mpi: bench/anchor.py --mpi (mpi4py) under Open MPI's mpirun, started in
  host 1; the other hosts' daemons are started by a remote-shell agent
  that enters their namespace (--mca plm_rsh_agent), btl tcp between hosts
  and shared memory (vader) within one. mpi_yield_when_idle: every host's
  ranks share this machine's cores, and Open MPI, counting 2 slots per
  host, would otherwise spin as if each had cores of its own (a 4-host
  8-byte all_reduce took 30 ms instead of about 1).
- gloo: bench/anchor.py (torch's gloo) under the same gorun launch,
  GLOO_SOCKET_IFNAME=eth0.

Every figure is judged against the link: the bound is the time the bytes
an algorithm sends over one host's link take at --rate (bound() below
counts them), and the table gives the % of it reached. After the rounds,
gorun's hierarchical all_reduce of 16 MiB on 2 hosts is run at --rate and
at half of it: were the cores the bottleneck, halving the rate would not
halve the bandwidth.

Needs root, iproute2 (ip, tc), util-linux (unshare), openmpi-bin,
python3-mpi4py and python3-torch. Namespaces PREFIX-h1.., PREFIX-sw and
/etc/netns/PREFIX-* are removed on exit, Ctrl-C or failure, and before
starting (a crashed earlier run's).

    /usr/bin/python3 bench/links.py --quick
    /usr/bin/python3 bench/links.py --hosts 2 --ops allreduce --sizes 1M,16M --rounds 3
    /usr/bin/python3 bench/links.py --gorun-bin ../other-tree/bin --systems gorun,gorun-hier --quick
"""
import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import collectives  # noqa: E402
from collectives import LATENCY_MAX, ROW, UNSUPPORTED, expected, label  # noqa: E402
from common import BUS_FACTOR, PY, ROOT, log, mpi_env, parse_size  # noqa: E402

OPS = collectives.OPS
SIZES = (8, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
QUICK_SIZES = (8, 1 << 20, 16 << 20)
HOSTS = (2, 4)
PER_HOST = 2  # ranks on each host
RATE = "2gbit"
PREFIX = "gorunlk"
SUBNET = "10.201.0"
# The algorithms GORUN_ALGO forces, per collective, between hosts (the
# shared-memory ones need a single host): the hierarchical form and every
# flat one, so that the automatic choice is judged against each.
ALGOS = {
    "allreduce": ("hier", "ring", "rhd", "rd"),
    "broadcast": ("hier", "tree", "chain"),
    "allgather": ("hier", "ring", "bruck"),
    "reduce_scatter": ("hier", "ring", "rd"),
    "alltoall": ("hier", "direct"),
}
ANCHORS = ("mpi", "gloo")
# Targets (issue 25), over 1 MiB to 64 MiB.
TARGET_SIZES = (1 << 20, 16 << 20, 64 << 20)
DEFAULT_VS_BEST = 0.95
ALLREDUCE_VS_MPI, ALLREDUCE_VS_GLOO, OTHER_VS_MPI = 1.5, 3.0, 1.0
HIER_BOUND_SHARE, HIER_BOUND_MIN = 0.9, 16 << 20
# Halving the rate must cut the bandwidth by at least this factor for the
# link, not the cores, to count as the bottleneck.
LINK_BOUND_RATIO = 1.6
# A launch that outlasts this many times the link's time for its calls,
# plus start-up, has hung (gloo has, now and then, on a busy machine).
TIMEOUT_FACTOR, TIMEOUT_START = 30, 120


def systems_for(op):
    return ("gorun",) + tuple("gorun-" + a for a in ALGOS[op]) + ANCHORS


# --- the emulated hosts ---------------------------------------------------

RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes(rate):
    """tc's RATE (e.g. 2gbit) in bytes per second; only bit units, so that
    tc and this file read it alike."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?bit)", rate.strip().lower())
    if not m:
        raise ValueError(f"links: rate {rate!r}: want a number and bit, kbit, mbit or gbit (e.g. 2gbit)")
    return float(m.group(1)) * RATE_UNITS[m.group(2)] / 8


def half_rate(rate):
    bits = rate_bytes(rate) * 8 / 2
    for unit in ("gbit", "mbit", "kbit"):
        if bits >= RATE_UNITS[unit] and bits % RATE_UNITS[unit] == 0:
            return f"{bits / RATE_UNITS[unit]:g}{unit}"
    return f"{bits:.0f}bit"


def sh(*argv, check=True):
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"links: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


class Hosts:
    """H namespaces PREFIX-h1..hH on shaped links. teardown() may run any
    number of times, and removes what an earlier run left too."""

    def __init__(self, prefix, subnet):
        self.prefix, self.subnet = prefix, subnet
        self.n = 0
        self.rate = None
        self.tmp = None
        # One run per prefix: teardown removes every PREFIX-* namespace,
        # a concurrent run's too.
        self.lock = open(f"/run/{prefix}.lock", "w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"links: another run uses the prefix {prefix}: give this one its own --prefix")

    def ns(self, i):
        return f"{self.prefix}-h{i + 1}"

    def addr(self, i):
        return f"{self.subnet}.{11 + i}"

    @property
    def switch(self):
        return f"{self.prefix}-sw"

    def mine(self):
        """Namespaces with this prefix, whoever made them."""
        out = sh("ip", "netns", "list", check=False).stdout
        return [line.split()[0] for line in out.splitlines()
                if line.split() and line.split()[0].startswith(self.prefix + "-")]

    def teardown(self):
        for ns in self.mine():
            # Only processes inside our namespaces: they are ours.
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)
        etc = "/etc/netns"
        if os.path.isdir(etc):
            for name in os.listdir(etc):
                if name.startswith(self.prefix + "-"):
                    shutil.rmtree(os.path.join(etc, name), ignore_errors=True)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        self.n = 0

    def setup(self, n, rate):
        """n hosts, every link shaped to rate both ways."""
        self.teardown()
        self.n, self.tmp = n, tempfile.mkdtemp(prefix=self.prefix + "-")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.addr(i)} {self.ns(i)}\n" for i in range(n))
        for i in range(n):
            ns = self.ns(i)
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # ip netns exec bind-mounts /etc/netns/NS/hosts over /etc/hosts:
            # every host's name resolves to its address in every namespace.
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts)
        if n == 2:
            sh("ip", "-n", self.ns(0), "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.ns(1))
        else:
            # The bridge lives in a namespace of its own: nothing in the
            # root namespace (its firewall included) is touched.
            sw = self.switch
            sh("ip", "netns", "add", sw)
            sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", sw, "link", "set", "br0", "up")
            for i in range(n):
                sh("ip", "-n", self.ns(i), "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i + 1}", "netns", sw)
                sh("ip", "-n", sw, "link", "set", f"p{i + 1}", "master", "br0", "up")
        for i in range(n):
            sh("ip", "-n", self.ns(i), "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            sh("ip", "-n", self.ns(i), "link", "set", "eth0", "up")
        self.shape(rate)
        self.write_agent()
        # Ready when every host's link is up (a bridge port takes a moment
        # to forward; the launches' own connect retries cover the rest).
        for i in range(n):
            for _ in range(100):
                if " UP " in sh("ip", "-n", self.ns(i), "-br", "link", "show", "eth0").stdout + " ":
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"links: {self.ns(i)}'s eth0 does not come up")

    def shape(self, rate):
        """Every host's link at rate, each direction: the host's egress on
        its eth0 and, through the bridge, its ingress on the bridge port
        (on a veth pair the other end's eth0 egress is this one's ingress)."""
        rate_bytes(rate)
        tbf = ["tbf", "rate", rate, "burst", "512kb", "latency", "50ms"]
        for i in range(self.n):
            sh("tc", "-n", self.ns(i), "qdisc", "replace", "dev", "eth0", "root", *tbf)
            if self.n > 2:
                sh("tc", "-n", self.switch, "qdisc", "replace", "dev", f"p{i + 1}", "root", *tbf)
        self.rate = rate

    def drops(self):
        """Packets the shapers dropped so far, all links together: TCP
        backs off on each, so many would mean the queues are too short."""
        total = 0
        places = [(self.ns(i), "eth0") for i in range(self.n)] + \
            ([(self.switch, f"p{i + 1}") for i in range(self.n)] if self.n > 2 else [])
        for ns, dev in places:
            out = sh("tc", "-n", ns, "-s", "qdisc", "show", "dev", dev, check=False).stdout
            total += sum(int(d) for d in re.findall(r"dropped (\d+)", out))
        return total

    def write_agent(self):
        """The remote-shell agent mpirun starts other hosts' daemons with:
        AGENT HOST COMMAND... runs COMMAND (a shell line, as ssh's) in
        HOST's namespace under its own hostname."""
        cases = "".join(f"  {self.addr(i)}|{self.ns(i)}) ns={self.ns(i)} ;;\n" for i in range(self.n))
        self.agent = os.path.join(self.tmp, "netns-agent")
        with open(self.agent, "w") as f:
            f.write("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n" + cases +
                    "  *) echo \"netns-agent: unknown host $host\" >&2; exit 255 ;;\nesac\n"
                    "exec ip netns exec \"$ns\" unshare --uts sh -c 'hostname \"$1\" && exec sh -c \"$2\"' sh \"$ns\" \"$*\"\n")
        os.chmod(self.agent, 0o755)
        self.hostfile = os.path.join(self.tmp, "hostfile")
        with open(self.hostfile, "w") as f:
            f.write("".join(f"{self.addr(i)} slots={PER_HOST}\n" for i in range(self.n)))

    def inside(self, i, argv):
        """argv run in host i's namespace, under its own hostname."""
        return ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.ns(i)] + argv


# --- what TCP itself moves ------------------------------------------------

# Run in every host: take CEILING_STREAMS connections from the previous
# host, open as many to the next, send for the given seconds, and print
# the bytes per second received meanwhile.
CEILING_PROG = r"""
import socket, sys, threading, time
peer, secs, streams = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
got = [0]
def drain(c):
    while True:
        b = c.recv(1 << 20)
        if not b:
            return
        got[0] += len(b)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("0.0.0.0", 5201))
ls.listen(streams)
def take():
    for _ in range(streams):
        threading.Thread(target=drain, args=(ls.accept()[0],), daemon=True).start()
threading.Thread(target=take, daemon=True).start()
out = []
for _ in range(streams):
    for _ in range(200):
        try:
            out.append(socket.create_connection((peer, 5201)))
            break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit("no connection to " + peer)
def send(c, end):
    buf = b"x" * (1 << 20)
    try:
        while time.monotonic() < end:
            c.sendall(buf)
    except OSError:
        pass  # the next host counted what it needed and left
end = time.monotonic() + 1 + secs
for c in out:
    threading.Thread(target=send, args=(c, end), daemon=True).start()
time.sleep(0.5)  # every host sending before the count starts
g0, t0 = got[0], time.monotonic()
time.sleep(secs)
print((got[0] - g0) / (time.monotonic() - t0))
"""
CEILING_STREAMS = 4


def tcp_ceiling(net, seconds=3.0):
    """What TCP itself moves over the shaped links with every link busy
    both ways (each host sends to the next, the last to the first; on 2
    hosts, each to the other), as iperf would measure it: the least any
    host received per second, over the rate. Headers (Ethernet, IP, TCP)
    and the acknowledgements going the other way take the rest, so a
    collective over TCP comes near it at best (within a point or two,
    with another number of streams)."""
    procs = [subprocess.Popen(net.inside(i, [PY, "-c", CEILING_PROG, net.addr((i + 1) % net.n), str(seconds),
                                             str(CEILING_STREAMS)]), stdout=subprocess.PIPE, text=True)
             for i in range(net.n)]
    got = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 30)
        if p.returncode != 0:
            raise RuntimeError(f"links: the TCP ceiling's sender exited {p.returncode}")
        got.append(float(out.strip()))
    return min(got) / rate_bytes(net.rate)


# --- one measurement ------------------------------------------------------

def clean_env(**extra):
    """The environment of every rank: ours, less what would steer a
    launcher or backend (an inherited GORUN_ALGO or GLOO_SOCKET_IFNAME=lo),
    plus extra; mpirun's root permission."""
    env = {k: v for k, v in mpi_env().items()
           if not k.startswith(("GORUN_", "PET_", "GLOO_", "MASTER_", "TORCHELASTIC_"))}
    env.update(extra)
    return env


def call_seconds(system, size, rate):
    """A call's expected time: the link's for twice the buffer."""
    est = 500e-6 + 2 * size / rate_bytes(rate)
    return est * 2 if system == "gloo" else est


def iterations(system, size, rate, quick):
    """(warmup, timed) calls: about half a second of link time per size
    (a quarter with --quick), at least 3 timed. Small calls take a
    millisecond or more here (2 cores run every host's ranks), so at most
    a few hundred. At least 2 warmup calls: with one, gorun's 16 MiB
    all_reduce on 2 hosts read 0.29 to 0.31 GB/s in 4 timed calls, where
    60 calls read 0.32 to 0.33 and 4 after 2 warmups 0.32 to 0.34."""
    est = call_seconds(system, size, rate)
    n = int(min(max((0.25 if quick else 0.6) / est, 3), 200 if quick else 500))
    return max(2, min(n // 4, 50)), n


class Runner:
    def __init__(self, net, gorun_bin, quick, btl):
        self.net, self.quick, self.btl = net, quick, btl
        self.gorun = os.path.join(gorun_bin, "gorun")
        self.perf = os.path.join(gorun_bin, "allreduce-perf")
        self.port = 29500

    def size_flags(self, system, sizes):
        plan = [iterations(system, s, self.net.rate, self.quick) for s in sizes]
        return ["-sizes", ",".join(map(str, sizes)),
                "-w", ",".join(str(w) for w, _ in plan), "-n", ",".join(str(n) for _, n in plan)]

    def launches(self, system, op, sizes):
        """[(argv, env)]: one per host for gorun's launches, one for mpirun."""
        net, flags = self.net, self.size_flags(system, sizes)
        anchor = [PY, os.path.join(ROOT, "bench", "anchor.py"), "-o", op] + flags
        if system == "mpi":
            subnet = f"{net.subnet}.0/24"
            argv = ["mpirun", "--hostfile", net.hostfile, "-np", str(PER_HOST * net.n), "--bind-to", "none",
                    "--mca", "pml", "ob1", "--mca", "btl", f"tcp,{self.btl},self",
                    "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
                    "--mca", "plm_rsh_agent", net.agent, "--mca", "plm_rsh_no_tree_spawn", "1",
                    "--mca", "mpi_yield_when_idle", "1"] + anchor + ["--mpi"]
            return [(net.inside(0, argv), clean_env())]
        if system == "gloo":
            prog, algo = anchor, "auto"
        else:
            prog = [self.perf, "-o", op, "-c", "0"] + flags
            algo = system.removeprefix("gorun-") if system != "gorun" else "auto"
        self.port = 29500 + (self.port - 29499) % 1000
        out = []
        for i in range(net.n):
            argv = [self.gorun, "--nnodes", str(net.n), "--node-rank", str(i), "--nproc-per-node", str(PER_HOST),
                    "--master-addr", net.addr(0), "--master-port", str(self.port),
                    "--local-ranks-filter", "0", "--log-level", "warn"] + prog
            env = clean_env(GORUN_HOST_ID=net.ns(i), GORUN_ALGO=algo, GORUN_TRANSPORT="auto",
                            GORUN_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
            out.append((net.inside(i, argv), env))
        return out

    def measure(self, system, op, sizes):
        """[time_us per size], or a string: why it has none (the backend
        lacks the collective, or the run failed: said on stderr too)."""
        world = PER_HOST * self.net.n
        procs = []
        logs = []
        for argv, env in self.launches(system, op, sizes):
            out = tempfile.TemporaryFile(mode="w+")
            logs.append(out)
            procs.append((argv, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                 start_new_session=True, cwd=ROOT)))
        said = f"{system} {op} on {self.net.n} hosts"
        timeout = TIMEOUT_START + TIMEOUT_FACTOR * sum(
            (w + n) * call_seconds(system, s, self.net.rate)
            for s, (w, n) in zip(sizes, (iterations(system, s, self.net.rate, self.quick) for s in sizes)))
        deadline = time.monotonic() + timeout
        failed = None
        try:
            for argv, p in procs:
                try:
                    rc = p.wait(timeout=max(deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    failed = f"timed out after {timeout:.0f} s"
                    break
                if rc != 0 and failed is None:
                    failed = f"exited {rc}"
        finally:
            for _, p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait()
        texts = []
        for f in logs:
            f.seek(0)
            texts.append(f.read())
            f.close()
        stdout = texts[0]
        unsupported = UNSUPPORTED.search(stdout)
        if unsupported and system == "gloo" and failed is None:
            return "n/a: " + unsupported.group(1).strip()
        if failed:
            tail = "\n".join(t[-2000:] for t in texts)
            log(f"links: {said} {failed}: {' '.join(procs[0][0])}\n{tail}")
            return "failed: " + failed
        rows = [m.groups() for m in map(ROW.match, stdout.splitlines()) if m]
        if len(rows) != len(sizes):
            log(f"links: {said} printed {len(rows)} rows for {len(sizes)} sizes:\n{stdout[-3000:]}")
            return f"failed: {len(rows)} rows for {len(sizes)} sizes"
        times = []
        for size, (nbytes, count, time_us, _algbw, busbw) in zip(sizes, rows):
            want = expected(op, size, world)
            if (int(nbytes), int(count)) != want:
                return f"failed: {size} B ran as size {nbytes} count {count}, want {want}"
            t = float(time_us)
            ours = want[0] / (t * 1e-6) / 1e9 * BUS_FACTOR[op](world)
            if abs(ours - float(busbw)) > 0.006 + 0.01 * ours:
                return f"failed: {size} B reports busbw {busbw}, its time gives {ours:.3f}"
            times.append(t)
        return times


# --- the link's bound -------------------------------------------------------

def host_of(rank):
    return rank // PER_HOST


def flows(op, algo, hosts, size):
    """[(from rank, to rank, bytes)] an algorithm sends for one call of
    SIZE bytes on hosts x PER_HOST ranks (rank r on host r // PER_HOST),
    or None where not modelled. Only what crosses hosts matters here."""
    n = hosts * PER_HOST
    s = expected(op, size, n)[0]
    out = []
    if algo == "hier":
        # Host sums meet at the leaders (ranks 0, PER_HOST, ...), which run
        # the bandwidth-optimal form among themselves.
        leaders = [h * PER_HOST for h in range(hosts)]
        share = {"allreduce": 2 * s / hosts, "reduce_scatter": s / hosts, "allgather": s / hosts,
                 "alltoall": PER_HOST * PER_HOST * s / n}.get(op)
        if op == "broadcast":
            return [(0, leaders[1], s)] if hosts == 2 else \
                [(leaders[i], leaders[i + 1], s) for i in range(hosts - 1)]  # pipelined chain
        # allreduce: a reduce-scatter and an all-gather, s/H each way per
        # pair; reduce_scatter, allgather: one of them; alltoall: each
        # host's ranks' blocks for the other host's ranks.
        return [(a, b, share) for a in leaders for b in leaders if a != b]
    if algo == "ring" and op in ("allreduce", "reduce_scatter", "allgather"):
        steps = 2 * (n - 1) if op == "allreduce" else n - 1
        return [(r, (r + 1) % n, s / n * steps) for r in range(n)]
    if algo == "rd" and op == "allreduce":
        mask = 1
        while mask < n:
            out += [(r, r ^ mask, s) for r in range(n)]
            mask <<= 1
        return out
    if algo == "rd" and op == "reduce_scatter":
        return flows("allreduce", "rd", hosts, size)
    if algo == "rhd" and op == "allreduce":
        mask, part = n // 2, s / 2  # halving from the farthest partner
        while mask >= 1:
            out += [(r, r ^ mask, 2 * part) for r in range(n)]  # its reduce-scatter and all-gather rounds
            mask //= 2
            part /= 2
        return out
    if algo == "bruck" and op == "allgather":
        have, d = 1, 1
        while have < n:
            k = min(have, n - have)
            out += [(r, (r - d) % n, s / n * k) for r in range(n)]
            have += k
            d *= 2
        return out
    if algo == "chain" and op == "broadcast":
        return [(r, r + 1, s) for r in range(n - 1)]
    if algo == "tree" and op == "broadcast":
        mask = 1
        while mask < n:
            mask <<= 1
        mask >>= 1
        while mask >= 1:
            out += [(r, r + mask, s) for r in range(0, n, 2 * mask) if r + mask < n]
            mask //= 2
        return out
    if algo == "direct" and op == "alltoall":
        return [(a, b, s / n) for a in range(n) for b in range(n) if a != b]
    return None


def lower_flows(op, hosts, size):
    """The least any algorithm must send over the links: what a
    hierarchical one sends."""
    return flows(op, "hier", hosts, size)


def link_seconds(fl, rate):
    """The busiest link direction's bytes at rate: a lower bound on time."""
    if fl is None:
        return None
    out, into = {}, {}
    for a, b, nbytes in fl:
        if host_of(a) != host_of(b):
            out[host_of(a)] = out.get(host_of(a), 0) + nbytes
            into[host_of(b)] = into.get(host_of(b), 0) + nbytes
    busiest = max(list(out.values()) + list(into.values()) + [0])
    return busiest / rate_bytes(rate)


def bound_busbw(op, algo, hosts, size, rate):
    """The busbw (GB/s) the link allows algo, or None."""
    t = link_seconds(flows(op, algo, hosts, size) if algo else lower_flows(op, hosts, size), rate)
    if not t:
        return None
    n = hosts * PER_HOST
    return expected(op, size, n)[0] / t / 1e9 * BUS_FACTOR[op](n)


# --- the run ----------------------------------------------------------------

def check_tools():
    """Exits naming what this machine lacks."""
    if os.geteuid() != 0:
        sys.exit("links: needs root (network namespaces and tc); run it as root")
    needs = []
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"),
                          ("mpirun", "openmpi-bin"), ("ompi_info", "openmpi-bin")):
        if shutil.which(tool) is None:
            needs.append(f"{tool} is not on PATH: apt-get install {package}")
    for module, package in (("mpi4py", "python3-mpi4py"), ("torch", "python3-torch"), ("numpy", "python3-numpy")):
        if subprocess.run([PY, "-c", f"import {module}"], capture_output=True).returncode != 0:
            needs.append(f"{PY} cannot import {module}: apt-get install {package}")
    if needs:
        sys.exit("links: cannot run:\n  " + "\n  ".join(needs))


def run(rounds, quick=False, hosts=HOSTS, ops=OPS, sizes=None, rate=RATE, systems=None,
        prefix=PREFIX, subnet=SUBNET, gorun_bin=None, rate_check=True):
    """Every measurement, interleaved; returns a JSON-able result for
    render()."""
    check_tools()
    gorun_bin = os.path.abspath(gorun_bin or os.path.join(ROOT, "bin"))
    for name in ("gorun", "allreduce-perf"):
        if not os.access(os.path.join(gorun_bin, name), os.X_OK):
            sys.exit(f"links: {gorun_bin}/{name} is not built: run make build")
    sizes = tuple(sizes or (QUICK_SIZES if quick else SIZES))
    rate_bytes(rate)
    btl = collectives.shm_btl()
    net = Hosts(prefix, subnet)
    runner = Runner(net, gorun_bin, quick, btl)
    result = {"rate": rate, "hosts": list(hosts), "ops": list(ops), "sizes": list(sizes), "rounds": rounds,
              "per_host": PER_HOST, "load_start": os.getloadavg()[0], "times": [], "notes": {}, "rate_check": [], "drops": {},
              "ceiling": {}}
    began = time.monotonic()

    def stop(signum, _frame):
        raise SystemExit(f"links: signal {signum}")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        for h in hosts:
            net.setup(h, rate)
            result["ceiling"][str(h)] = tcp_ceiling(net)
            log(f"[links {h} hosts] TCP moves {result['ceiling'][str(h)]:.1%} of the rate")
            for r in range(rounds):
                for op in ops:
                    names = [s for s in systems_for(op) if (not systems or s in systems) and
                             not result["notes"].get(f"{s}|{op}|{h}", "").startswith("n/a")]
                    if not names:
                        continue
                    order = names[r % len(names):] + names[:r % len(names)]
                    t0 = time.monotonic()
                    for system in order:
                        got = runner.measure(system, op, sizes)
                        if isinstance(got, str):
                            result["notes"][f"{system}|{op}|{h}"] = got
                            continue
                        for size, t in zip(sizes, got):
                            result["times"].append({"system": system, "op": op, "hosts": h, "size": size,
                                                    "round": r, "time_us": t})
                    log(f"[links {h} hosts, round {r + 1}/{rounds}] {op}: {time.monotonic() - t0:.0f} s")
            result["drops"][str(h)] = net.drops()
            if rate_check:
                best = fastest(result, h)
                result["rate_check"].append(check_link_bound(runner, net, rate, max(rounds, 2), best))
            net.teardown()
    finally:
        net.teardown()
        signal.signal(signal.SIGTERM, old)
    result["seconds"] = time.monotonic() - began
    result["load_end"] = os.getloadavg()[0]
    return result


def fastest(result, hosts, size=16 << 20):
    """gorun's fastest system at a 16 MiB all_reduce on hosts, where the
    rounds measured one; else the hierarchical one."""
    got = {}
    for t in result["times"]:
        if (t["op"], t["hosts"], t["size"]) == ("allreduce", hosts, size) and t["system"].startswith("gorun"):
            got.setdefault(t["system"], []).append(t["time_us"])
    return min(got, key=lambda s: statistics.median(got[s])) if got else "gorun-hier"


def check_link_bound(runner, net, rate, rounds, system):
    """system's all_reduce of 16 MiB at rate and at half of it,
    alternating: {rate: [busbw per round]}. Were the link all of the time,
    halving the rate would double it; what scales with the rate is
    (t(half) - t(rate)) / t(rate) of it."""
    size, half = 16 << 20, half_rate(rate)
    got = {rate: [], half: []}
    world = PER_HOST * net.n
    for r in range(rounds):
        for at in ((rate, half) if r % 2 == 0 else (half, rate)):
            net.shape(at)
            t = runner.measure(system, "allreduce", (size,))
            if isinstance(t, list):
                got[at].append(expected("allreduce", size, world)[0] / (t[0] * 1e-6) / 1e9 *
                               BUS_FACTOR["allreduce"](world))
    net.shape(rate)
    log(f"[links rate check] {got}")
    return {"hosts": net.n, "size": size, "rate": rate, "half": half, "busbw": got, "system": system}


# --- the tables ---------------------------------------------------------------

class Table:
    def __init__(self, result):
        self.res = result
        self.times = {}
        for t in result["times"]:
            self.times.setdefault((t["system"], t["op"], t["hosts"], t["size"]), []).append(t["time_us"])

    def value(self, system, op, hosts, size):
        """busbw (GB/s), latency (us) for the 8-byte rows, or None."""
        t = self.times.get((system, op, hosts, size))
        if not t:
            return None
        med = statistics.median(t)
        if size <= LATENCY_MAX:
            return med
        n = hosts * PER_HOST
        return expected(op, size, n)[0] / (med * 1e-6) / 1e9 * BUS_FACTOR[op](n)

    def ratio(self, a, b, op, hosts, size):
        """a's advantage over b (bandwidth a/b, latency b/a), or None."""
        x, y = self.value(a, op, hosts, size), self.value(b, op, hosts, size)
        if not x or not y:
            return None
        return y / x if size <= LATENCY_MAX else x / y

    def best_forced(self, op, hosts, size):
        forced = [s for s in systems_for(op) if s.startswith("gorun-") and self.value(s, op, hosts, size)]
        if not forced:
            return None
        key = (lambda s: -self.value(s, op, hosts, size)) if size <= LATENCY_MAX else \
            (lambda s: self.value(s, op, hosts, size))
        return max(forced, key=key)

    def cell(self, system, op, hosts, size):
        v = self.value(system, op, hosts, size)
        if v is None:
            note = self.res["notes"].get(f"{system}|{op}|{hosts}", "")
            return "n/a" if note.startswith("n/a") else ("failed" if note else "-")
        text = f"{v:.1f}" if size <= LATENCY_MAX else (f"{v:.3f}" if v < 1 else f"{v:.2f}")
        t = self.times[(system, op, hosts, size)]
        return text + collectives.NOISY if max(t) > collectives.NOISY_SPREAD * min(t) else text

    def bound_cell(self, system, op, hosts, size):
        """% of the link bound of the system's own algorithm (the least
        any algorithm needs, for the automatic choice and the anchors)."""
        v = self.value(system, op, hosts, size)
        algo = system.removeprefix("gorun-") if system.startswith("gorun-") else None
        b = bound_busbw(op, algo, hosts, size, self.res["rate"])
        if v is None or b is None or size <= LATENCY_MAX:
            return None
        return v / b

    def render(self):
        res = self.res
        rate = res["rate"]
        lines = [f"### Between emulated hosts: {PER_HOST} ranks per host, links shaped to {rate} each way "
                 f"(tc tbf), median of {res['rounds']} interleaved rounds; busbw in GB/s, 8-byte rows latency in us",
                 "",
                 f"Load average {res['load_start']:.2f} at start, {res.get('load_end', 0):.2f} at the end, "
                 f"{res.get('seconds', 0):.0f} s. gorun = automatic choice, gorun-ALGO = GORUN_ALGO=ALGO; "
                 "mpi = Open MPI over TCP between hosts (vader within); gloo = torch 1.13 gloo. "
                 "bound = the busbw the link allows the least traffic any algorithm needs "
                 "(each host sends or receives its share once: a hierarchical algorithm); "
                 "%bound = gorun's automatic choice against it.", ""]
        verdicts = []
        for hosts in res["hosts"]:
            for op in res["ops"]:
                names = [s for s in systems_for(op) if any(k[0] == s and k[1] == op and k[2] == hosts for k in self.times)]
                if not names:
                    continue
                lines += [f"#### {op}, {hosts} hosts x {PER_HOST} ranks", "",
                          "| size | " + " | ".join(names) + " | bound | %bound | best forced | default/best | "
                          "default/mpi | default/gloo |",
                          "|---|" + "---|" * (len(names) + 6)]
                for size in res["sizes"]:
                    shown = expected(op, size, hosts * PER_HOST)[0]
                    unit = " (us)" if size <= LATENCY_MAX else ""
                    cells = [self.cell(s, op, hosts, size) for s in names]
                    b = bound_busbw(op, None, hosts, size, rate)
                    share = self.bound_cell("gorun", op, hosts, size)
                    best = self.best_forced(op, hosts, size)
                    vs_best = self.ratio("gorun", best, op, hosts, size) if best else None
                    vs = [self.ratio("gorun", a, op, hosts, size) for a in ANCHORS]
                    fmt = lambda x: "-" if x is None else f"{x:.2f}x"
                    lines.append(f"| {label(shown)}{unit} | " + " | ".join(cells) +
                                 f" | {'' if size <= LATENCY_MAX or b is None else f'{b:.3f}'}"
                                 f" | {'' if share is None else f'{share * 100:.0f}%'}"
                                 f" | {best or '-'} | {fmt(vs_best)} | {fmt(vs[0])} | {fmt(vs[1])} |")
                    verdicts += self.targets(op, hosts, size, best, vs_best, vs)
                lines.append("")
            lines += self.algo_bounds(hosts) + [""]
        lines += self.rate_lines(verdicts)
        ceiling = res.get("ceiling") or {}
        if ceiling:
            lines.append("What TCP itself moves over these links, every link busy both ways (iperf's way, "
                         f"{CEILING_STREAMS} streams per host): " +
                         ", ".join(f"{c:.1%} of the rate on {h} hosts" for h, c in ceiling.items()) +
                         "; headers and acknowledgements take the rest, so a collective over TCP comes near that share of the bound at best.")
        drops = res.get("drops") or {}
        if drops:
            lines.append("Packets the shapers dropped over the run: " +
                         ", ".join(f"{d} on {h} hosts" for h, d in drops.items()) + ".")
        notes = sorted(f"{k.replace('|', ' ', 1).replace('|', ' on ')} hosts: {v}" for k, v in res["notes"].items())
        if notes:
            lines += [""] + [f"- {n}" for n in notes]
        lines += ["", f"{collectives.NOISY}: its rounds differ by more than {collectives.NOISY_SPREAD:g}x."]
        return lines, verdicts

    def targets(self, op, hosts, size, best, vs_best, vs):
        where = f"{op}, {hosts} hosts, {label(size)}"
        out = []
        if best:
            ok = vs_best is not None and vs_best >= DEFAULT_VS_BEST
            out.append((f"links: default within 5% of best forced ({best}), {where}",
                        "not run" if vs_best is None else f"{vs_best:.2f}x (need {DEFAULT_VS_BEST:.2f}x)", ok))
        if size in TARGET_SIZES:
            needs = [("mpi", ALLREDUCE_VS_MPI), ("gloo", ALLREDUCE_VS_GLOO)] if op == "allreduce" \
                else [("mpi", OTHER_VS_MPI)]
            for (anchor, need), r in zip(needs, vs):
                if anchor == "gloo" and f"gloo|{op}|{hosts}" in self.res["notes"]:
                    continue
                out.append((f"links: default >= {need:g}x {anchor}, {where}",
                            "not run" if r is None else f"{r:.2f}x (need {need:.2f}x)", r is not None and r >= need))
        if op == "allreduce" and size >= HIER_BOUND_MIN:
            share = self.bound_cell("gorun-hier", op, hosts, size)
            out.append((f"links: hier all_reduce >= {HIER_BOUND_SHARE:.0%} of the link bound, {where}",
                        "not run" if share is None else f"{share:.0%}", share is not None and share >= HIER_BOUND_SHARE))
        return out

    def algo_bounds(self, hosts):
        """What each forced algorithm's traffic allows, and how much of it
        it reached, at the largest size."""
        res = self.res
        size = max(res["sizes"])
        rows = []
        for op in res["ops"]:
            for s in systems_for(op):
                if not s.startswith("gorun-"):
                    continue
                algo = s.removeprefix("gorun-")
                b = bound_busbw(op, algo, hosts, size, res["rate"])
                v = self.value(s, op, hosts, size)
                if b is None or size <= LATENCY_MAX:
                    continue
                rows.append(f"| {op} | {algo} | {b:.3f} | {'-' if v is None else f'{v:.3f}'} | "
                            f"{'-' if v is None else f'{v / b:.0%}'} |")
        if not rows:
            return []
        return [f"Link bound of each forced algorithm's traffic, {hosts} hosts, {label(size)} "
                f"(busiest host link direction's bytes at {res['rate']}; 'hier' assumes the hierarchical form):", "",
                "| collective | algorithm | bound busbw | measured | % of bound |", "|---|---|---|---|---|"] + rows

    def rate_lines(self, verdicts):
        lines = []
        for rc in self.res.get("rate_check") or []:
            a, b = rc["busbw"].get(rc["rate"]), rc["busbw"].get(rc["half"])
            what = f"links: the link is the bottleneck on {rc['hosts']} hosts (busbw at {rc['rate']} / at {rc['half']})"
            if not a or not b:
                verdicts.append((what, "not run", False))
                lines.append(f"Link check, {rc['hosts']} hosts: not run (failed).")
                continue
            ratio = statistics.median(a) / statistics.median(b)
            met = ratio >= LINK_BOUND_RATIO
            verdicts.append((what, f"{ratio:.2f}x (need {LINK_BOUND_RATIO:.2f}x)", met))
            lines.append(f"Link check: {rc.get('system', 'gorun-hier')} all_reduce {label(rc['size'])} on "
                         f"{rc['hosts']} hosts: {statistics.median(a):.3f} GB/s at {rc['rate']}, "
                         f"{statistics.median(b):.3f} at {rc['half']}: {ratio:.2f}x for 2x the rate, "
                         f"{ratio - 1:.0%} of its time at {rc['rate']} is the link's "
                         f"({'the link is the bottleneck' if met else 'NOT link-bound: the cores, or phases the link waits on'}).")
        return lines


def render(result):
    """(markdown lines, verdicts [(what, ratio text, met)])."""
    return Table(result).render()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="sizes 8,1M,16M, shorter runs, 1 round")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3, 1 with --quick)")
    p.add_argument("--hosts", default=",".join(map(str, HOSTS)), help="emulated host counts, of 2 and 4")
    p.add_argument("--rate", default=RATE, help="each link's rate each way, as tc reads it (default 2gbit)")
    p.add_argument("--ops", default=",".join(OPS), help="some of " + ",".join(OPS))
    p.add_argument("--sizes", help="bytes, K/M/G suffixes (default 8,64K,1M,16M,64M; quick 8,1M,16M)")
    p.add_argument("--systems", help="only these systems, e.g. gorun,gorun-hier,mpi (default all)")
    p.add_argument("--prefix", default=PREFIX, help="namespace name prefix (default gorunlk)")
    p.add_argument("--subnet", default=SUBNET, help="first three octets of the hosts' /24 (default 10.201.0)")
    p.add_argument("--gorun-bin", help="folder with gorun and allreduce-perf (default bin/ of this tree)")
    p.add_argument("--no-rate-check", action="store_true", help="skip the half-rate run that checks the link is the bottleneck")
    p.add_argument("--json", help="write the raw result here (plot.py reads it)")
    args = p.parse_args()
    hosts = tuple(int(v) for v in args.hosts.split(","))
    if any(h not in (2, 4) for h in hosts):
        sys.exit("links: --hosts: 2 and/or 4")
    ops = tuple(v.strip() for v in args.ops.split(","))
    if any(op not in OPS for op in ops):
        sys.exit(f"links: --ops: some of {','.join(OPS)}")
    sizes = tuple(parse_size(v) for v in args.sizes.split(",")) if args.sizes else None
    try:
        rate_bytes(args.rate)
    except ValueError as e:
        sys.exit(str(e))
    if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", args.subnet):
        sys.exit("links: --subnet: three octets, e.g. 10.201.0")
    systems = tuple(args.systems.split(",")) if args.systems else None
    result = run(args.rounds or (1 if args.quick else 3), args.quick, hosts, ops, sizes, args.rate, systems,
                 args.prefix, args.subnet, args.gorun_bin, not args.no_rate_check)
    lines, verdicts = render(result)
    missed = [v for v in verdicts if not v[2]]
    lines += ["", f"Targets: {len(verdicts) - len(missed)} of {len(verdicts)} met"] + \
        [f"- MISSED {what}: {ratio}" for what, ratio, _ in missed]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
