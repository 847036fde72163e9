"""torch 2.6 TCPStore counterpart of the Go interop tests, run in the torch
2.6 root (see internal/torch2test).

  torch2_client.py serve
      Hosts torch's own TCPStore server on a free port of 127.0.0.1, prints
      {"port": N} and serves until stdin closes: libuv's where this torch
      has it (as on a GPU machine's pip torch; stderr says which).
  torch2_client.py client HOST PORT
      Runs every operation of 2.6's Python binding against the server at
      HOST:PORT and prints one JSON line per step, {"step": ..., "result":
      ...}; the Go test asserts the results. Before its blocking wait on
      "woken" it prints the step "waiting" and expects the Go side to set
      the key.

Debian builds torch 2.6 without libuv, which 2.x asks for by default: every
client here says use_libuv=False, and the server falls back to it. Values
are printed as latin-1 strings; failures as {"error": message}.
"""

import datetime
import json
import sys

import torch
import torch.distributed as dist


def out(step, result):
    print(json.dumps({"step": step, "result": result}), flush=True)


def text(b):
    return b.decode("latin-1")


def attempt(step, fn):
    try:
        out(step, fn())
    except Exception as e:  # torch raises RuntimeError subclasses
        out(step, {"error": "%s: %s" % (type(e).__name__, e)})


def serve():
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    except RuntimeError:  # built without libuv
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=False)
    print(f"torch2_client.py: torch {torch.__version__} serving, libuv: {store.libuvBackend}", file=sys.stderr, flush=True)
    out("port", store.port)
    sys.stdin.read()


def client(host, port):
    def connect(**kwargs):
        return dist.TCPStore(host, port, is_master=False, use_libuv=False,
                             timeout=datetime.timedelta(seconds=10), **kwargs)

    # A non-master waiting for workers sends ADD "init/" +1 and goes on, as
    # in torchelastic's agent-store mode.
    s = connect(world_size=2, wait_for_workers=True)
    out("libuv", s.libuvBackend)

    s.set("k1", "v1")
    out("set_get", text(s.get("k1")))
    s.set("bin", b"\x00\xff")
    out("set_get_bytes", text(s.get("bin")))
    out("add", [s.add("cnt", 5), s.add("cnt", -2), text(s.get("cnt"))])
    s.set("ovf", "9223372036854775807")
    out("add_overflow", s.add("ovf", 1))

    s.set("bad", "P")
    attempt("add_non_integer", lambda: s.add("bad", 1))
    s = connect(wait_for_workers=False)  # the server closed that connection
    out("after_add_non_integer", text(s.get("bad")))

    out("check", [s.check(["k1"]), s.check(["k1", "cnt"]), s.check(["k1", "nokey"]), s.check([])])

    out("compare_set", [
        text(s.compare_set("cs_missing", "abc", "y")),
        text(s.compare_set("cs", "", "first")),
        text(s.compare_set("cs", "first", "second")),
        text(s.compare_set("cs", "stale", "x")),
        text(s.get("cs")),
    ])

    s.append("ap", "a")
    s.append("ap", b"\x00b")
    s.append("ap", "")
    out("append", text(s.get("ap")))

    s.multi_set(["m1", "m2", "m3"], ["x", b"\xff", ""])
    out("multi_get", [text(v) for v in s.multi_get(["m3", "m1", "m2", "m1"])])
    out("multi_get_empty", s.multi_get([]))
    s.multi_set([], [])
    attempt("multi_set_mismatch", lambda: s.multi_set(["a", "b"], ["1"]))

    s.wait(["k1", "cnt"])
    out("wait_present", True)
    s.wait(["k1"], datetime.timedelta(seconds=5))
    out("wait_present_timeout", True)
    attempt("wait_timeout", lambda: s.wait(["nokey"], datetime.timedelta(milliseconds=200)))
    attempt("wait_multi_timeout", lambda: s.wait(["k1", "nokey2"], datetime.timedelta(milliseconds=200)))
    # The connection goes on after a timed out wait.
    out("after_wait_timeout", text(s.get("k1")))

    out("delete_key", [s.delete_key("k1"), s.delete_key("k1"), s.check(["k1"])])

    before = s.num_keys()
    s.set("nk_a", "")
    s.set("nk_b", "")
    s.set("nk_a", "again")
    out("num_keys_delta", s.num_keys() - before)
    out("num_keys", s.num_keys())

    s.set_timeout(datetime.timedelta(milliseconds=300))
    attempt("set_timeout_get", lambda: text(s.get("never")))
    s = connect(wait_for_workers=False)

    # Operations newer releases add; 2.6 has them or not, and says which.
    later = ["queue_push", "queue_pop", "queue_len", "list_keys"]
    out("later_ops", [op for op in later if hasattr(s, op)])
    if hasattr(s, "queue_push"):
        s.queue_push("q", "one")
        s.queue_push("q", "two")
        out("queue", [s.queue_len("q"), text(s.queue_pop("q")), text(s.queue_pop("q", block=False))])
    if hasattr(s, "list_keys"):
        out("list_keys", "cs" in s.list_keys())

    out("waiting", True)
    s.wait(["woken"])
    out("woken", text(s.get("woken")))
    out("done", True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        client(sys.argv[2], int(sys.argv[3]))
