"""Load generation for ``inferbus bench``, the benchmark suite (``bench/``) and ``inferbus up --demo``.

* :class:`Workload`: inputs (distinct = cache misses, repeated = hits), their
  pre-encoded request bodies and reference answers from in-process ONNX Runtime.
* :class:`LeanDriver`: closed- and open-loop steps on one NATS connection with no
  task or future per request (see its module for the open-loop tick schedule).
* :class:`GeneratorPool` / :class:`EchoPool`: generators and echo responders in
  their own processes, so the generator never shares the served pipeline's event loop.
* :func:`closed_loop` / :func:`open_loop`: the same loops through the Python SDK,
  in the caller's event loop (demo, SDK tests).

Latencies go into HDR histograms (1 µs .. 1 hour, 3 significant digits); every
answer is checked against the reference.
"""

from ._client_loops import closed_loop, open_loop
from ._lean import LeanDriver, Target, echo_target, infer_target
from ._procs import EchoPool, GeneratorPool, split
from ._result import PERCENTILES, BenchResult, Recorder, merge_wire, render_table
from ._workload import Workload

__all__ = [
    "PERCENTILES", "BenchResult", "EchoPool", "GeneratorPool", "LeanDriver", "Recorder", "Target", "Workload",
    "closed_loop", "echo_target", "infer_target", "merge_wire", "open_loop", "render_table", "split",
]
