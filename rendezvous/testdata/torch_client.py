"""torch 1.13 TCPStore counterpart of the Go interop tests.

  torch_client.py serve
      Hosts torch's own TCPStore server on a free port of 127.0.0.1, prints
      {"port": N} and serves until stdin closes.
  torch_client.py client HOST PORT
      Runs every operation of 1.13's Python binding against the server at
      HOST:PORT and prints one JSON line per step, {"step": ..., "result":
      ...}; the Go test asserts the results. Before its blocking wait on
      "woken" it prints the step "waiting" and expects the Go side to set
      the key.

Values are printed as latin-1 strings; failures as {"error": message}.
"""

import datetime
import json
import sys

import torch.distributed as dist


def out(step, result):
    print(json.dumps({"step": step, "result": result}), flush=True)


def text(b):
    return b.decode("latin-1")


def attempt(step, fn):
    try:
        out(step, fn())
    except Exception as e:  # torch raises RuntimeError subclasses
        out(step, {"error": str(e)})


def serve():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out("port", store.port)
    sys.stdin.read()


def client(host, port):
    def connect(**kwargs):
        return dist.TCPStore(host, port, is_master=False,
                             timeout=datetime.timedelta(seconds=10), **kwargs)

    # A non-master waiting for workers sends ADD "init/" +1 and goes on, as
    # in torchelastic's agent-store mode.
    s = connect(world_size=2, wait_for_workers=True)

    s.set("k1", "v1")
    out("set_get", text(s.get("k1")))
    s.set("bin", b"\x00\xff")
    out("set_get_bytes", text(s.get("bin")))
    out("add", [s.add("cnt", 5), s.add("cnt", -2), text(s.get("cnt"))])

    quirks = []
    for i, stored in enumerate(["12abc", "  7", "+4", "0x10"]):
        s.set("quirk%d" % i, stored)
        quirks.append(s.add("quirk%d" % i, 1))
    out("add_quirks", quirks)
    s.set("ovf", "9223372036854775807")
    out("add_overflow", s.add("ovf", 1))

    s.set("bad", "P")
    attempt("add_non_integer", lambda: s.add("bad", 1))
    s = connect(wait_for_workers=False)  # the server closed that connection
    out("after_add_non_integer", text(s.get("bad")))

    out("compare_set", [
        text(s.compare_set("cs_missing", "abc", "y")),
        text(s.compare_set("cs", "", "first")),
        text(s.compare_set("cs", "first", "second")),
        text(s.compare_set("cs", "stale", "x")),
        text(s.get("cs")),
        text(s.compare_set("cs_empty", "", "")),
    ])

    s.wait(["k1", "cnt"])
    out("wait_present", True)
    attempt("wait_timeout", lambda: s.wait(["nokey"], datetime.timedelta(milliseconds=200)))
    attempt("wait_multi_timeout", lambda: s.wait(["k1", "nokey2"], datetime.timedelta(milliseconds=200)))

    out("delete_key", [s.delete_key("k1"), s.delete_key("k1")])

    before = s.num_keys()
    s.set("nk_a", "")
    s.set("nk_b", "")
    s.set("nk_a", "again")
    out("num_keys_delta", s.num_keys() - before)
    out("num_keys", s.num_keys())

    s.set_timeout(datetime.timedelta(milliseconds=300))
    attempt("set_timeout_get", lambda: text(s.get("never")))
    s.set_timeout(datetime.timedelta(seconds=10))

    out("waiting", True)
    s.wait(["woken"])
    out("woken", text(s.get("woken")))
    out("done", True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        client(sys.argv[2], int(sys.argv[3]))
