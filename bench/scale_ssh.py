"""Scale: one command over 16 to 128 real OpenSSH "hosts", reached by alias.

Starts one sshd per host on 127.0.1.1, 127.0.1.2, ..., each in its own UTS
namespace (so `hostname` says h001, h002, ...), with its own host key,
key-only logins, MaxStartups left at its default (10:30:100), and writes
an ssh_config in which every host is known only by its alias (Host h001 /
HostName 127.0.1.1) plus a known_hosts that lists the addresses. Then, in
one run and interleaved, it launches one worker per host with

  * gorun --hosts h001,... --ssh-config/--ssh-identity/--ssh-known-hosts,
    flat (--ssh-no-tree) and tree (the default, --ssh-fanout 32), where the
    gorun binary supports them (otherwise today's gorun, flat);
  * mpirun (Open MPI 4.1) --host h001,... with -F <ssh_config> for its ssh,
    which spawns its orted daemons as a tree of radix 64 (its defaults:
    the head itself starts up to 64, each of those starts its share);

and, with --explain N, also a bare OpenSSH fan-out (one `ssh -F
<ssh_config> hNNN true` per host, all at once: what sshd, key exchange and
the login shell cost), the CPU every launch spends per host on the head and
on the hosts, and gorun's phases from its debug log.

The worker (bench/sshstamp) appends "hostname CLOCK_MONOTONIC" to a file,
so "all started" is the last worker's stamp minus the moment the command
was started, and "done" is the command's exit. While it runs, the head (the
launcher process and its local children, e.g. mpirun's ssh clients) is
sampled every 20 ms: resident memory (summed over the tree; the head
process's own VmHWM is exact), open file descriptors, and the SSH sessions
it holds (established TCP connections from its sockets to the sshd port).

Every host gets one connection per launch, so sshd's MaxStartups is never
reached here; it is left at its default. This machine's root ~/.bashrc runs
`pyenv init` (seconds per login under load); each host's own mount
namespace shows an empty one in its place, as a plain host would have
(--keep-bashrc with --explain keeps it).

Runs as root; cleans up every sshd it started, their sessions and its
temporary folder, also on Ctrl-C or failure.

    /usr/bin/python3 bench/scale_ssh.py [--quick] [--rounds N]
"""
import argparse
import ctypes
import json
import os
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from common import ROOT, log, mpi_env

SSHD = "/usr/sbin/sshd"  # absolute: sshd re-executes itself
BASHRC = os.path.join(os.path.expanduser("~root"), ".bashrc")
TARGET = 0.5             # gorun's all-started time at most this fraction of mpirun's
FANOUT = 32              # gorun's default --ssh-fanout
GOAL_SIZES = (64, 128)
SIZES = (16, 32, 64, 128)
QUICK_SIZES = (64, 128)
RUN_TIMEOUT = 600        # seconds one launch may take before it counts as hung
SAMPLE_EVERY = 0.02      # seconds between samples of the head

# tool -> Debian package that provides it
TOOLS = {
    SSHD: "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "mpirun": "openmpi-bin",
    "orted": "openmpi-bin",
    "unshare": "util-linux",
    "hostname": "hostname",
    "go": "golang-go (or the Go toolchain gorun is built with)",
}


def check_tools():
    """Stops naming the Debian package of the first missing tool."""
    if os.geteuid() != 0:
        sys.exit("scale_ssh: must run as root (it starts sshd servers and UTS namespaces)")
    for tool, pkg in TOOLS.items():
        if shutil.which(tool) is None:
            sys.exit(f"scale_ssh: {tool} not found: apt-get install {pkg}")
    if not os.access(os.path.join(ROOT, "bin", "gorun"), os.X_OK):
        sys.exit("scale_ssh: bin/gorun not found: run `make build` first")


# ---------------------------------------------------------------- processes

def children(pid):
    """Direct children of pid, from /proc/PID/task/*/children."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(c) for c in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def tree(pid):
    """pid and all its descendants, parents first."""
    pids, i = [pid], 0
    while i < len(pids):
        pids += children(pids[i])
        i += 1
    return pids


def kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reaped_cpu(pid):
    """CPU seconds of pid's children that it has waited for (cutime+cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[13]) + int(rest[14])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    """CPU seconds of this process's waited-for children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def become_subreaper():
    """Orphans of a launch (mpirun's ssh clients outlive it) are reparented
    to this process instead of init, so reaping them counts their CPU."""
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans(keep, timeout=10):
    """Waits for this process's children other than keep (the sshd
    daemons) to exit, and reaps them."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in children(os.getpid()) if pid not in keep]
        for pid in left:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    left.remove(pid)
            except ChildProcessError:
                left.remove(pid)
        if not left:
            return
        if time.monotonic() > deadline:
            kill_pids(left)
            for pid in left:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            return
        time.sleep(0.02)


def pids_mentioning(text):
    """Processes whose command line contains text (our temp folder), not us."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(d))
        except OSError:
            pass
    return found


# ------------------------------------------------------------------ cluster

def free_port(addrs):
    """A port that every address can listen on."""
    for port in range(22022, 23000, 17):
        socks = []
        try:
            for a in addrs:
                s = socket.socket()
                socks.append(s)
                s.bind((a, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    sys.exit("scale_ssh: no port free on all loopback host addresses")


class Cluster:
    """n throwaway sshd "hosts", h001 at 127.0.1.1 and so on, reachable only
    through the generated ssh_config. Use as a context manager: leaving it
    kills every sshd it started (by pid), their sessions, and removes the
    folder."""

    def __init__(self, n, mask_bashrc=True):
        assert 0 < n <= 250
        self.n, self.mask_bashrc = n, mask_bashrc
        self.names = [f"h{i:03d}" for i in range(1, n + 1)]
        self.addrs = [f"127.0.1.{i}" for i in range(1, n + 1)]
        self.dir = None
        self.daemons = []  # Popen of each sshd (unshare and sh exec into it: same pid)

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self):
        t0 = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="gorun-scale-ssh-")
        os.chmod(self.dir, 0o700)
        d = self.dir
        subprocess.run(["install", "-d", "-m", "0755", "-o", "root", "-g", "root", "/run/sshd"], check=True)
        self.key = os.path.join(d, "id_client")
        self.known_hosts = os.path.join(d, "known_hosts")
        self.config = os.path.join(d, "ssh_config")
        self.stamp = os.path.join(d, "sshstamp")
        build = subprocess.Popen(["go", "build", "-o", self.stamp, "./bench/sshstamp"], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.port = free_port(self.addrs)
        keygens = [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "scale-ssh", "-f", self.key])]
        for name in self.names:
            os.mkdir(os.path.join(d, name), 0o700)
            keygens.append(subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                                             "-f", os.path.join(d, name, "host_key")]))
        for k in keygens:
            if k.wait() != 0:
                raise RuntimeError("scale_ssh: ssh-keygen failed")
        known, conf = [], []
        for name, addr in zip(self.names, self.addrs):
            hd = os.path.join(d, name)
            with open(os.path.join(hd, "sshd_config"), "w") as f:
                f.write("\n".join([
                    f"Port {self.port}",
                    f"ListenAddress {addr}",
                    f"HostKey {hd}/host_key",
                    "PidFile none",
                    f"AuthorizedKeysFile {self.key}.pub",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",       # no pam_loginuid trouble in containers
                    "StrictModes no",  # the keys live under the 1777 /tmp
                    "UseDNS no",
                    "PrintMotd no",
                    "LogLevel ERROR",
                    # MaxStartups stays at its default, 10:30:100.
                ]) + "\n")
            with open(os.path.join(hd, "host_key.pub")) as f:
                known.append(f"[{addr}]:{self.port} " + " ".join(f.read().split()[:2]))
            conf.append(f"Host {name}\n  HostName {addr}\n")
        with open(self.known_hosts, "w") as f:
            f.write("\n".join(known) + "\n")
        with open(self.config, "w") as f:
            f.write("".join(conf) + "\n".join([
                "Host *",
                f"  Port {self.port}",
                "  User root",
                f"  IdentityFile {self.key}",
                "  IdentitiesOnly yes",
                "  IdentityAgent none",
                f"  UserKnownHostsFile {self.known_hosts}",
                "  StrictHostKeyChecking yes",
                "  CheckHostIP no",
                "  BatchMode yes",
                "  LogLevel ERROR",
                "  ConnectTimeout 60",
            ]) + "\n")
        # A host's own mount namespace shows an empty ~/.bashrc in place of
        # this machine's, which runs `pyenv init` (seconds per login under
        # load) in every bash that sshd starts for a command.
        mask = ""
        if self.mask_bashrc and os.path.exists(BASHRC):
            open(os.path.join(d, "bashrc"), "w").close()
            mask = f"mount --bind {d}/bashrc {BASHRC} && "
        for name in self.names:
            hd = os.path.join(d, name)
            sh = f"hostname {name} && {mask}exec {SSHD} -D -f {hd}/sshd_config -E {hd}/sshd.log"
            self.daemons.append(subprocess.Popen(["unshare", "--uts", "--mount", "--", "sh", "-c", sh],
                                                 start_new_session=True,
                                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL))
        self._wait_ready()
        out, _ = build.communicate()
        if build.returncode != 0:
            raise RuntimeError(f"scale_ssh: go build ./bench/sshstamp failed:\n{out}")
        # One real login through the alias proves keys, config and hostname.
        got = subprocess.run(["ssh", "-F", self.config, self.names[-1], "hostname"], capture_output=True,
                             text=True, timeout=60)
        if got.stdout.strip() != self.names[-1]:
            raise RuntimeError(f"scale_ssh: ssh {self.names[-1]} hostname said {got.stdout!r} {got.stderr!r}")
        log(f"[scale_ssh] {self.n} sshd hosts ready on port {self.port} in {time.monotonic() - t0:.1f} s")

    def _wait_ready(self):
        """Until every sshd greets a TCP connection with its banner."""
        deadline = time.monotonic() + 60
        for name, addr, p in zip(self.names, self.addrs, self.daemons):
            while True:
                if p.poll() is not None:
                    with open(os.path.join(self.dir, name, "sshd.log")) as f:
                        raise RuntimeError(f"scale_ssh: sshd of {name} exited: {f.read()}")
                try:
                    with socket.create_connection((addr, self.port), timeout=2) as s:
                        s.settimeout(2)
                        if s.recv(64).startswith(b"SSH-2.0-"):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"scale_ssh: sshd of {name} not ready")
                time.sleep(0.02)

    def sessions(self):
        """Processes serving connections: the descendants of every sshd."""
        return [pid for p in self.daemons for pid in tree(p.pid)[1:]]

    def hosts_cpu(self):
        """CPU seconds that every host's connections have used so far: sshd's
        children (the per-connection sshd, the shell, what it ran) are
        reaped by the listener once they end, with their descendants'."""
        return sum(reaped_cpu(p.pid) for p in self.daemons)

    def settle(self, timeout=15):
        """Waits until no sshd serves a connection any more (the previous
        launch fully gone), then kills what is left of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sessions():
                return
            time.sleep(0.05)
        left = self.sessions()
        log(f"[scale_ssh] killing {len(left)} processes left by the previous launch")
        kill_pids(left)

    def close(self):
        for p in self.daemons:
            kill_pids(tree(p.pid)[1:])
            kill_pids([p.pid])
        for p in self.daemons:
            p.wait()
        if self.dir:
            kill_pids(pids_mentioning(self.dir))
            shutil.rmtree(self.dir, ignore_errors=True)
        self.daemons = []


# ------------------------------------------------------------------ launches

def gorun_has_tree():
    out = subprocess.run([os.path.join(ROOT, "bin", "gorun"), "--help"], capture_output=True, text=True).stdout
    return "--ssh-no-tree" in out


def launchers(c, n, stampfile, tree_support):
    """name -> argv (None = the bare ssh fan-out, run by this script)."""
    names = c.names[:n]
    gorun = [os.path.join(ROOT, "bin", "gorun"), "--hosts", ",".join(names), "--nproc-per-node", "1",
             "--ssh-config", c.config, "--ssh-identity", c.key, "--ssh-known-hosts", c.known_hosts]
    worker = [c.stamp, stampfile]
    out = {}
    if tree_support:
        out["gorun flat"] = gorun + ["--ssh-no-tree"] + worker
        out["gorun tree"] = gorun + worker
    else:
        out["gorun"] = gorun + worker
    out["mpirun"] = ["mpirun", "--host", ",".join(names), "-np", str(n),
                     "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {c.config}",
                     "--mca", "oob_tcp_if_include", "lo"] + worker
    return out


class Sampler:
    """Samples the head's process tree until stopped: peak summed RSS, the
    head process's VmHWM, peak open fds and peak SSH sessions to port."""

    def __init__(self, pid, port):
        self.pid, self.port = pid, port
        self.rss_kb = self.hwm_kb = self.fds = self.sessions = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_EVERY)

    def sample(self):
        rss, fds, socks = 0, 0, set()
        for i, pid in enumerate(tree(self.pid)):
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            rss += int(line.split()[1])
                        elif line.startswith("VmHWM:") and i == 0:
                            self.hwm_kb = max(self.hwm_kb, int(line.split()[1]))
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    fds += 1
                    try:
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if link.startswith("socket:["):
                        socks.add(link[8:-1])
            except OSError:
                continue
        self.rss_kb, self.fds = max(self.rss_kb, rss), max(self.fds, fds)
        if len(socks) > self.sessions:  # only then can the peak of sessions grow
            self.sessions = max(self.sessions, len(socks & self.ssh_client_sockets()))

    def ssh_client_sockets(self):
        """Inodes of established TCP connections to the sshd port."""
        out = set()
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                col = line.split()
                if col[3] == "01" and int(col[2].rsplit(":", 1)[1], 16) == self.port:
                    out.add(col[9])
        return out

    def finish(self):
        self.stop.set()
        self.thread.join()


def ssh_fanout(c, n, command):
    """The floor: one plain ssh per host, all at once, like pdsh -f n."""
    procs = [subprocess.Popen(["ssh", "-F", c.config, name] + command, stdin=subprocess.DEVNULL)
             for name in c.names[:n]]
    return procs


def timestamped(stream, t0, out, lines):
    """Copies stream to out, and (seconds since t0, line) to lines."""
    for line in stream:
        lines.append(((time.monotonic_ns() - t0) / 1e9, line))
        out.write(line)


def launch(c, n, name, argv, stampfile, logfile, timeline=None, worker=True):
    """Runs one launch; returns its figures, or raises naming what failed.
    A timeline list receives the launcher's output lines, timestamped; with
    worker False the bare ssh fan-out runs `true` instead of the worker."""
    open(stampfile, "w").close()
    c.settle()
    host_cpu0, head_cpu0 = c.hosts_cpu(), children_cpu()
    with open(logfile, "w") as out:
        t0 = time.monotonic_ns()
        if argv is None:
            procs = ssh_fanout(c, n, [c.stamp, stampfile] if worker else ["true"])
            sampler = None
            try:
                rcs = [p.wait(timeout=RUN_TIMEOUT) for p in procs]
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            t1 = time.monotonic_ns()
            rc = max(rcs, key=abs)
        else:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out if timeline is None else subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env=mpi_env(), text=True)
            sampler = Sampler(p.pid, c.port)
            if timeline is not None:
                reader = threading.Thread(target=timestamped, args=(p.stdout, t0, out, timeline), daemon=True)
                reader.start()
            try:
                rc = p.wait(timeout=RUN_TIMEOUT)
                t1 = time.monotonic_ns()
            finally:
                sampler.finish()
                if timeline is not None:
                    reader.join(5)
                if p.poll() is None:
                    kill_pids(tree(p.pid))
                    p.wait()
    c.settle()
    reap_orphans({p.pid for p in c.daemons})
    head_cpu = children_cpu() - head_cpu0
    host_cpu = c.hosts_cpu() - host_cpu0
    with open(stampfile) as f:
        stamps = [line.split() for line in f if line.strip()]
    hosts = sorted(s[0] for s in stamps)
    if not worker:
        stamps, hosts = [["-", str(t1)]], c.names[:n]
    if rc != 0 or hosts != c.names[:n]:
        with open(logfile) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"scale_ssh: {name} on {n} hosts: exit {rc}, {len(stamps)} of {n} workers ran "
                           f"(missing: {sorted(set(c.names[:n]) - set(hosts))[:8]}); output:\n{tail}")
    r = {"started": (max(int(s[1]) for s in stamps) - t0) / 1e9, "done": (t1 - t0) / 1e9,
         "first": (min(int(s[1]) for s in stamps) - t0) / 1e9,
         "head_cpu": head_cpu, "host_cpu": host_cpu}
    if sampler:
        r.update(rss_mib=sampler.rss_kb / 1024, hwm_mib=sampler.hwm_kb / 1024, fds=sampler.fds,
                 sessions=sampler.sessions)
    return r


class CPUShares:
    """With shares, moves this process (so every sshd and launcher it
    starts) into a cgroup v1 cpu group of that weight (1024 is every other
    task's), for a figure close to a quiet machine's on a busy one; back
    into the root group and the group removed on leaving."""

    ROOT = "/sys/fs/cgroup/cpu"

    def __init__(self, shares):
        self.shares, self.dir = shares, None

    def __enter__(self):
        if not self.shares:
            return self
        if not os.path.exists(os.path.join(self.ROOT, "cpu.shares")):
            sys.exit("scale_ssh: --cpu-shares needs the cgroup v1 cpu controller at " + self.ROOT)
        self.dir = os.path.join(self.ROOT, f"gorun-scale-ssh-{os.getpid()}")
        os.mkdir(self.dir)
        with open(os.path.join(self.dir, "cpu.shares"), "w") as f:
            f.write(str(self.shares))
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return self

    def __exit__(self, *exc):
        if not self.dir:
            return
        with open(os.path.join(self.ROOT, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        for _ in range(100):  # until the last process of a launch has left
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)
        log(f"[scale_ssh] could not remove {self.dir}")


def interrupted(signum, frame):
    """SIGTERM unwinds like Ctrl-C, so the cluster is cleaned up."""
    raise KeyboardInterrupt(f"signal {signum}")


def run(rounds, quick=False, sizes=None, cpu_shares=0):
    """Interleaved launches over one cluster; returns
    {"sizes", "launchers", "runs": {name: {n: [figures per round]}}, "seconds"}.
    cpu_shares, when set, runs it all in a cpu cgroup of that weight."""
    check_tools()
    become_subreaper()
    t_begin = time.monotonic()
    sizes = sorted(sizes or (QUICK_SIZES if quick else SIZES))
    tree_support = gorun_has_tree()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        with CPUShares(cpu_shares), Cluster(max(sizes)) as c:
            stampfile = os.path.join(c.dir, "stamps")
            logfile = os.path.join(c.dir, "launch.log")
            names = list(launchers(c, sizes[0], stampfile, tree_support))
            runs = {name: {n: [] for n in sizes} for name in names}
            for r in range(rounds):
                for k, n in enumerate(sizes if r % 2 == 0 else reversed(sizes)):
                    cmds = launchers(c, n, stampfile, tree_support)
                    order = names[(r + k) % len(names):] + names[:(r + k) % len(names)]
                    for name in order:
                        runs[name][n].append(launch(c, n, name, cmds[name], stampfile, logfile))
                    log(f"[scale_ssh round {r + 1}/{rounds}] {n} hosts: " + ", ".join(
                        f"{name} {runs[name][n][-1]['started']:.2f}/{runs[name][n][-1]['done']:.2f} s" for name in names))
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return {"sizes": sizes, "launchers": names, "runs": runs, "fanout": FANOUT,
            "seconds": time.monotonic() - t_begin, "cpu_shares": cpu_shares}


# -------------------------------------------------------------------- report

def slope(xs, ys):
    """Least-squares seconds per host and intercept."""
    if len(xs) < 2:
        return float("nan"), float("nan")
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return b, my - b * mx


def render(result):
    sizes, names, runs = result["sizes"], result["launchers"], result["runs"]
    sizes = [int(n) for n in sizes]
    runs = {name: {int(n): v for n, v in by.items()} for name, by in runs.items()}

    def med(name, n, key):
        vals = [r[key] for r in runs[name][n] if key in r]
        return statistics.median(vals) if vals else None

    def peak(name, n, key):
        vals = [r[key] for r in runs[name][n] if key in r]
        return max(vals) if vals else None

    rounds = len(runs[names[0]][sizes[0]])
    lines = [
        f"### Scale: one worker on each of N sshd hosts on loopback, reached by ssh_config alias "
        f"(median of {rounds}; head = the launcher and its local children)",
        "",
        "| hosts | launcher | all started (s) | done (s) | started / mpirun | head peak RSS (MiB) "
        "| head max fds | head max ssh sessions | CPU per host: head + hosts (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        mp = med("mpirun", n, "started")
        for name in names:
            st, dn = med(name, n, "started"), med(name, n, "done")
            rss, fds, ses = peak(name, n, "rss_mib"), peak(name, n, "fds"), peak(name, n, "sessions")
            hc, oc = med(name, n, "head_cpu"), med(name, n, "host_cpu")
            lines.append(f"| {n} | {name} | {st:.2f} | {dn:.2f} | {st / mp:.2f}x | {rss:.0f} | {fds} | {ses} | "
                         f"{hc / n * 1e3:.0f} + {oc / n * 1e3:.0f} |")
    lines += ["", "| launcher | per host (ms, slope of all started) | fixed (s) |", "|---|---|---|"]
    for name in names:
        b, a = slope(sizes, [med(name, n, "started") for n in sizes])
        lines.append(f"| {name} | {b * 1e3:.0f} | {a:.2f} |")
    gorun = "gorun tree" if "gorun tree" in names else "gorun"
    verdicts = []
    lines.append("")
    for n in GOAL_SIZES:
        if n not in sizes:
            continue
        ratio = med(gorun, n, "started") / med("mpirun", n, "started")
        ses = peak(gorun, n, "sessions")
        met = ratio <= TARGET and ses <= result.get("fanout", FANOUT)
        verdict = "met" if met else "MISSED"
        lines.append(f"Target {gorun} on {n} hosts all started <= {TARGET}x mpirun with at most "
                     f"{result.get('fanout', FANOUT)} sessions at the head: {ratio:.2f}x, {ses} sessions, {verdict}.")
        verdicts.append((f"ssh: {n} hosts by alias, all started <= {TARGET}x mpirun, head sessions <= fan-out",
                         f"{ratio:.2f}x, {ses} sessions", met))
        cpu = lambda name: med(name, n, "head_cpu") + med(name, n, "host_cpu")  # noqa: E731
        lines.append(f"  (CPU per launch, head and hosts, {gorun} / mpirun: {cpu(gorun) / cpu('mpirun'):.2f}x; "
                     "where the machine is busy, a launcher with more processes runnable at once gets a larger "
                     "share of it, so compare this too)")
    shares = f"; run in a cpu cgroup of {result['cpu_shares']} shares" if result.get("cpu_shares") else ""
    lines.append(f"(section took {result['seconds']:.0f} s; sshd MaxStartups at its default 10:30:100, "
                 f"one connection per sshd per launch{shares})")
    return lines, verdicts


PHASES = [  # (label, message in gorun's log, first or last occurrence)
    ("last ssh connected", "ssh connected", max),
    ("endpoint asked", "rendezvous endpoint", min),
    ("first agent started", "starting remote command", min),
    ("last agent started", "started the remote agents", min),
    ("store up", "hosting the rendezvous store", min),
    ("last agent joined", "hosts the rendezvous store; joining it", max),
    ("round complete", "round complete", min),
]


def explain(n, keep_bashrc=False):
    """Where the time and CPU of one launch on n hosts go: a bare ssh `true`
    fan-out (sshd, key exchange, login shell), the same running the worker,
    each launcher; CPU per host on the head and on the hosts; and gorun's
    phases from its debug log."""
    check_tools()
    become_subreaper()
    tree_support = gorun_has_tree()
    lines = [f"### Where one launch on {n} hosts goes (CPU per host: head / the hosts' sshd, shell and "
             "what ran; ~/.bashrc " + ("as on this machine" if keep_bashrc else "empty") + ")", "",
             "| launch | all started (s) | done (s) | head CPU / host (ms) | host CPU / host (ms) |",
             "|---|---|---|---|---|"]
    phases = {}
    with Cluster(n, mask_bashrc=not keep_bashrc) as c:
        stampfile = os.path.join(c.dir, "stamps")
        logfile = os.path.join(c.dir, "launch.log")
        cmds = launchers(c, n, stampfile, tree_support)
        runs = [("ssh fan-out, true", None, False), ("ssh fan-out, worker", None, True)] + [
            (k, v, True) for k, v in cmds.items()]
        for name, argv, worker in runs:
            timeline = None
            if argv and argv[0].endswith("gorun"):
                argv = argv[:1] + ["--log-level", "debug"] + argv[1:]
                timeline = []
            r = launch(c, n, name, argv, stampfile, logfile, timeline, worker)
            lines.append(f"| {name} | {r['started']:.2f} | {r['done']:.2f} | {r['head_cpu'] / n * 1e3:.0f} | "
                         f"{r['host_cpu'] / n * 1e3:.0f} |")
            if timeline is not None:
                got = {}
                for label, msg, pick in PHASES:
                    ts = [t for t, line in timeline if msg in line]
                    if ts:
                        got[label] = pick(ts)
                got["first worker"], got["last worker"], got["exit"] = r["first"], r["started"], r["done"]
                phases[name] = got
    for name, got in phases.items():
        lines += ["", f"{name} phases (s since the command): " + ", ".join(
            f"{label} {t:.2f}" for label, t in sorted(got.items(), key=lambda kv: kv[1]))]
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 2, --quick 1)")
    p.add_argument("--quick", action="store_true", help="64 and 128 hosts only")
    p.add_argument("--sizes", help="comma-separated host counts (at most 250)")
    p.add_argument("--json", help="also write the raw result to this file")
    p.add_argument("--cpu-shares", type=int, default=0, metavar="N",
                   help="run in a cgroup v1 cpu group of N shares (others have 1024): on a busy machine, "
                        "closer to a quiet one's figures, at the other processes' expense")
    p.add_argument("--explain", type=int, metavar="N", help="instead: where one launch on N hosts spends its time")
    p.add_argument("--keep-bashrc", action="store_true", help="with --explain: leave the hosts this machine's ~/.bashrc")
    args = p.parse_args()
    if args.explain:
        print("\n".join(explain(args.explain, args.keep_bashrc)))
        return
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    result = run(args.rounds or (1 if args.quick else 2), args.quick, sizes, args.cpu_shares)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    lines, _ = render(result)
    print("\n".join(lines))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"scale_ssh: interrupted ({e or 'Ctrl-C'}); every sshd it started is stopped")
