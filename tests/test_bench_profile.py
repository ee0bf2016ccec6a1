"""bench.profile_hotpath's summary of py-spy's collapsed stacks: self, inclusive and per-layer shares."""

from __future__ import annotations

from bench.profile_hotpath import LAYERS, layer, summarize

LOOP = "Runner.run (asyncio/runners.py:118)"  # py-spy's short file names
MAIN = "<module> (inferbus/actors/__main__.py:27)"


def test_layers_sort_frames_by_package_and_charge_loop_c_time_to_the_loop():
    assert layer(LOOP) == "event loop (C) + system calls"
    assert layer("run (/usr/lib/python3.12/asyncio/runners.py:118)") == "event loop (C) + system calls"  # full path
    assert layer("run (/x/site-packages/uvloop/__init__.py:82)") == "event loop (C) + system calls"
    assert layer("Parser.parse (nats/protocol/parser.py:85)") == "nats-py"
    assert layer("Queue.get (asyncio/queues.py:149)") == "asyncio (Python)"
    assert layer("Session.run (onnxruntime/capi/onnxruntime_inference_collection.py:266)") == "onnxruntime"
    assert layer("Ingress._handle (inferbus/actors/_ingress.py:348)") == "inferbus"
    assert layer("Ingress._handle (/srv/app/inferbus/actors/_ingress.py:348)") == "inferbus"
    assert layer("Queue.qsize (queue.py:92)") == "other"
    assert layer("not a frame") == "other"


def test_summarize_gives_self_inclusive_and_layer_shares(tmp_path):
    raw = tmp_path / "p.txt"
    raw.write_text("\n".join([
        f"process 1:python;thread (0x1);{MAIN};{LOOP} 6",
        f"process 1:python;thread (0x1);{MAIN};{LOOP};Ingress._handle (inferbus/actors/_ingress.py:348) 3",
        f"process 1:python;thread (0x1);{MAIN};{LOOP};Parser.parse (/x/site-packages/nats/protocol/parser.py:85) 1",
        "garbage line without a count",
    ]) + "\n")
    s = summarize(raw)
    assert s["samples"] == 10
    assert s["layers"]["event loop (C) + system calls"] == 60.0
    assert s["layers"]["inferbus"] == 30.0 and s["layers"]["nats-py"] == 10.0
    assert set(s["layers"]) == set(LAYERS) and abs(sum(s["layers"].values()) - 100.0) < 1e-6
    assert dict(s["inclusive"])["Runner.run (asyncio/runners.py)"] == 100.0
    assert s["self"][0] == ("Runner.run (asyncio/runners.py)", 60.0)
    assert dict(s["self"])["Parser.parse (nats/protocol/parser.py)"] == 10.0  # full path shortened
