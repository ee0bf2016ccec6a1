"""Profile the hot path under load with py-spy: ingress, worker, a load generator and an echo responder.

    python -m bench.profile_hotpath --seconds 10 --concurrency 64 --out bench/results/profile
    python -m bench.profile_hotpath --colocate --no-l2 --mode open --rate-qps 2750 --direct   # + the direct floor

Starts one nats-server, a node (1 ingress, 1 worker by default), echo
responders and generator processes as the suite does, drives a closed loop of
cache misses (then of echo requests) and samples each process with
``py-spy record --nonblocking --format raw`` (collapsed stacks). Writes the raw
stacks per process and prints, per process, the functions with the most
samples on top of the stack (self) and anywhere on it (inclusive), as shares
of the samples. ``--direct`` also drives and samples a direct responder (the suite's ``--direct`` floor:
decode, model at batch 1, encode, in one nats-py handler) with the same load, so that the serving path's
process and the floor's compare by layer and function at one rate. ``py-spy`` must be installed (``pip install py-spy``) and
allowed to read other processes (root, or ptrace permitted).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from inferbus.actors import Node, NodeConfig
from inferbus.bus import EmbeddedNats
from inferbus.loadgen import EchoPool, GeneratorPool

from . import _args as args

ROOT = Path(__file__).resolve().parents[1]
_FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    f = m["file"]
    f = re.sub(r"^.*?(?:site-packages/|lib/python3[.0-9]*/)", "", f)  # full paths (--full-filenames) as py-spy's short ones
    return f"{m['func']} ({f})"


LAYERS = ("event loop (C) + system calls", "nats-py", "asyncio (Python)", "onnxruntime", "numpy", "msgspec",
          "inferbus", "other")
"""What :func:`layer` sorts a sample's innermost Python frame into (``layers`` of :func:`summarize`)."""


def layer(frame: str) -> str:
    """The layer of one py-spy frame ``func (file:line)``: the file's package; the event loop's own C code and the
    system calls under it are the self time of the frame that entered the loop (``Runner.run``, ``uvloop.run``),
    because py-spy without ``--native`` charges C time to the innermost Python frame."""
    m = _FRAME.match(frame.strip())
    if not m:
        return "other"
    func, parts = m["func"], m["file"].split("/")  # py-spy's short form (asyncio/runners.py) or a full path
    if "uvloop" in parts or (func.endswith("run") and parts[-2:] == ["asyncio", "runners.py"]):
        return "event loop (C) + system calls"
    for package, name in (("onnxruntime", "onnxruntime"), ("nats", "nats-py"), ("asyncio", "asyncio (Python)"),
                          ("numpy", "numpy"), ("msgspec", "msgspec"), ("inferbus", "inferbus")):
        if package in parts:
            return name
    return "other"


def summarize(raw: Path, top: int = 25) -> dict:
    """Self and inclusive sample shares per function from a py-spy raw (collapsed) file, and the self shares per
    :data:`LAYERS` entry (``layers``, percent; with ``samples`` the raw count, so that two processes sampled at
    the same rate for the same time compare in absolute terms)."""
    self_c: collections.Counter = collections.Counter()
    incl_c: collections.Counter = collections.Counter()
    layer_c: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        raw_frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        frames = [_short(f) for f in raw_frames]
        if not frames:
            continue
        total += n
        layer_c[layer(raw_frames[-1])] += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    pct = lambda c: [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)]  # noqa: E731
    return {"samples": total, "self": pct(self_c), "inclusive": pct(incl_c),
            "layers": {k: round(100 * layer_c[k] / total, 1) for k in LAYERS} if total else {}}


async def _record(pids: dict[str, int], seconds: float, out: Path, rate: int) -> dict[str, subprocess.Popen]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    procs = {}
    for name, pid in pids.items():
        procs[name] = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                                        "--rate", str(rate), "--nonblocking", "--format", "raw",
                                        "--output", str(out / f"{name}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return procs


async def run(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mdir = str(ROOT / "models")
    tmp = tempfile.TemporaryDirectory(prefix="inferbus-prof-")
    nats = EmbeddedNats(run_dir=Path(tmp.name) / "nats")
    nats.start()
    node = None
    report = {}
    try:
        echo = EchoPool(1, nats.url, "bench.echo", log_dir=Path(tmp.name))
        await echo.start()
        direct = None
        if a.direct:
            from inferbus.actors._repository import ModelRepository

            mv = next(iter(ModelRepository(mdir, [a.model]).get(a.model).versions.values()))
            direct = EchoPool(1, nats.url, "bench.direct", log_dir=Path(tmp.name),
                              model=(str(mv.path), a.model, mv.version))
            await direct.start()
        node = Node(NodeConfig(models_dir=mdir, workers=a.workers, ingress=1, nats_url=nats.url, models=(a.model,),
                               no_cache=not a.l2, run_dir=str(Path(tmp.name) / "node"), colocate=a.colocate))
        await node.start()
        await node.wait_ready(120)
        gp = GeneratorPool(a.gens, nats.url, mdir, pool=8192, log_dir=Path(tmp.name))
        await gp.start()
        try:
            miss = {"kind": "inferbus", "name": "inferbus", "model": a.model, "version": "1", "distinct": not a.hits}
            e = {"kind": "echo", "name": "echo", "model": a.model, "version": "1", "subject": "bench.echo"}
            d = {"kind": "direct", "name": "direct", "model": a.model, "version": "1", "subject": "bench.direct"}
            await gp.prepare([miss, e] + ([d] if direct is not None else []))
            await gp.step(miss, mode="closed", concurrency=8, duration_s=1)
            pids = {c.id.split(":")[0] + "-" + c.id.split(":")[-1]: c.pid for c in node.supervisor.which_children()}
            pids = {k: v for k, v in pids.items() if not k.startswith("aggregator")}
            pids["loadgen"] = gp.children[0].proc.pid
            spies = await _record(pids, a.seconds, out, a.rate)
            res = await gp.step(miss, mode=a.mode, concurrency=a.concurrency if a.mode == "closed" else None,
                                rate=a.rate_qps if a.mode == "open" else None, duration_s=a.seconds + 1)
            for p in spies.values():
                p.wait()
            report["inferbus"] = {"qps": res.qps, "p50_us": res.p50_us, "p99_us": res.p99_us,
                                  "stages_us": res.stages_us}
            legs = [("echo", e, echo)]
            if direct is not None:
                legs.append(("direct", d, direct))
            for name, target, pool in legs:
                spies = await _record({name: pool.children[0].proc.pid, f"loadgen-{name}": gp.children[0].proc.pid},
                                      a.seconds, out, a.rate)
                res = await gp.step(target, mode=a.mode, concurrency=a.concurrency if a.mode == "closed" else None,
                                    rate=a.rate_qps if a.mode == "open" else None, duration_s=a.seconds + 1)
                for p in spies.values():
                    p.wait()
                report[name] = {"qps": res.qps, "p50_us": res.p50_us, "p99_us": res.p99_us}
        finally:
            await gp.close()
            await echo.close()
            if direct is not None:
                await direct.close()
    finally:
        if node is not None:
            await node.stop()
        nats.stop()
        tmp.cleanup()
    for f in sorted(out.glob("*.txt")):
        report[f.stem + " profile"] = summarize(f, a.top)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_hotpath", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=args.positive, default=10)
    p.add_argument("--mode", choices=("closed", "open"), default="closed")
    p.add_argument("--concurrency", type=args.count, default=64)
    p.add_argument("--rate-qps", type=args.positive, default=1000)
    p.add_argument("--workers", type=args.count, default=1)
    p.add_argument("--gens", type=args.count, default=1)
    p.add_argument("--model", default="digits")
    p.add_argument("--l2", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--colocate", action="store_true", help="each worker slot one process with its ingress")
    p.add_argument("--hits", action="store_true", help="replay the dataset's rows (L1 hits after the first round) "
                   "instead of distinct inputs (misses)")
    p.add_argument("--direct", action="store_true",
                   help="also drive and sample a direct responder (the Python floor) with the same load")
    p.add_argument("--rate", type=args.count, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=args.count, default=25)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "profile"))
    a = p.parse_args(argv)
    if not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()):
        p.error("py-spy is not installed: pip install -e '.[bench]' (or pip install py-spy)")
    import json

    import uvloop

    report = uvloop.run(run(a))
    for k, v in report.items():
        if k.endswith("profile"):
            print(f"\n== {k} ({v['samples']} samples) — self %")
            for f, pc in v["self"]:
                print(f"  {pc:5.1f}  {f}")
            print("-- self % by layer: " + ", ".join(f"{k} {pc}" for k, pc in v["layers"].items()))
            print("-- inclusive %")
            for f, pc in v["inclusive"][:15]:
                print(f"  {pc:5.1f}  {f}")
        else:
            print(k, json.dumps(v))
    (Path(a.out) / "summary.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
