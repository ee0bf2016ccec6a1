"""``inferbus bench``: load from generator processes, HDR percentiles, every answer checked.

Two forms:

* ``inferbus bench [MODEL] [--nats-url URL] ...``: closed-loop concurrencies and
  open-loop rates against a running deployment (or one started here), driven
  by :class:`inferbus.loadgen.GeneratorPool` processes so the generator never
  shares an event loop with what it measures;
* ``inferbus bench --suite [--profile P] [--json F] [--png F]``: the whole
  benchmark suite of the repository's ``bench/`` folder (floors, inferbus, the
  Ray Serve peer, ratios, plot); needs a checkout (run from its root).
"""

from __future__ import annotations

import sys
from pathlib import Path


def run_suite(args: list[str]) -> int:
    """Run ``python -m bench.suite`` in this process with ``args``; its exit status.

    Raises:
        typer.Exit: (2) no checkout here: one line, ``error: bench: --suite needs the repository's bench/ folder:
            ...``, as every command's usage error.
    """
    root = Path.cwd()
    if not (root / "bench" / "suite.py").is_file():
        from .cli import _usage

        _usage("bench: --suite needs the repository's bench/ folder: run it from a checkout's root")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.suite import main  # type: ignore[import-not-found]

    # its one-line refusals (an --out that cannot be written, an unknown model...) name bench's options
    return main(args, said_as=("bench: ", {"--json": "--out", "--models-dir": "--models", "--model": "model",
                                           "--timeout": "--timeout-s"}))


async def _served_default(url: str, prefix: str, model: str, version: str | None) -> str | None:
    """``version``, else the default version the running deployment serves for ``model`` (its metadata), or
    None if it does not say. Connects either way, so an unreachable ``url`` fails here, before any generator starts.

    Raises:
        NatsUnreachable: no server of ``url`` accepted the connection.
        InferbusError: the deployment answered with an error (e.g. NOT_FOUND for an unknown model).
    """
    from .cli import _one_shot_client

    client = await _one_shot_client(url, prefix)
    try:
        if version is not None:
            return version
        meta = await client.model(model, timeout_s=5.0)
    finally:
        await client.close()
    v = (meta.parameters or {}).get("default_version")
    return str(v) if v is not None else None


async def _check_served(url: str, prefix: str, model: str, version: str) -> None:
    """Raise the deployment's NOT_FOUND when it does not serve ``version`` of ``model`` (its metadata), before any
    generator starts: a version not served (not loaded, or left out by the model's version_policy) ran every step and
    then said NOT_FOUND for each request, exit 1. A deployment that does not answer the metadata request within 2 s
    (hung, or no ingress) is benchmarked all the same: its steps say what it answers (nothing: exit 1, as before).

    Raises:
        NatsUnreachable: no server of ``url`` accepted the connection.
        InferbusError: the deployment answered with an error other than UNAVAILABLE (NOT_FOUND: ``version`` is not
            served).
    """
    from .cli import _one_shot_client
    from .schemas import DeadlineExceeded, Unavailable

    client = await _one_shot_client(url, prefix)
    try:
        await client.model(model, version, timeout_s=2.0)
    except (Unavailable, DeadlineExceeded):
        pass
    finally:
        await client.close()


async def run_load(*, model: str, version: str | None, models_dir: str, nats_url: str | None, workers: int,
                   ingress: int, gens: int, concurrency: list[int], rates: list[float], duration_s: float,
                   hit: bool, timeout_s: float, prefix: str, spread: bool = False, busy_poll_us: float = 0.0):
    """Start a node unless ``nats_url`` is given, then run the steps from ``gens`` generator processes
    (``spread``: generator ``k`` connects to server ``k mod n`` of ``nats_url`` first; ``busy_poll_us``: the
    started node's ``NodeConfig.busy_poll_us``).

    Returns:
        the list of :class:`~inferbus.loadgen.BenchResult`, in step order.
    """
    from ._signals import StoppedBySignal, until_signal
    from .loadgen._procs import GeneratorFailed

    # SIGTERM and SIGINT (Ctrl-C) stop the run: the generator processes and the node started here are stopped, their
    # run folder removed, and one line says so (SIGTERM's default action killed bench alone and left its generators
    # running for ~15 s; a Ctrl-C stopped it without a word). A second signal cancels the stop itself.
    try:
        return await until_signal(_run_steps(
            model=model, version=version, models_dir=models_dir, nats_url=nats_url, workers=workers, ingress=ingress,
            gens=gens, concurrency=concurrency, rates=rates, duration_s=duration_s, hit=hit, timeout_s=timeout_s,
            prefix=prefix, spread=spread, busy_poll_us=busy_poll_us))
    except StoppedBySignal as exc:
        print(f"bench: stopped by {exc.args[0].name} (its generators and the node it started are stopped; "
              f"no results are printed for a run cut short)", file=sys.stderr, flush=True)
        raise SystemExit(128 + exc.args[0]) from None
    except GeneratorFailed as exc:  # one line, not a traceback (a generator that died or gave no answer in time; a
        # fresh-user trial once saw one wait 66 s when the node it flooded stopped: _procs.FLUSH_TIMEOUT_S says why)
        print(f"bench: a load generator failed: {' '.join(str(exc).split())[:1200]}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


async def _run_steps(*, model, version, models_dir, nats_url, workers, ingress, gens, concurrency, rates, duration_s,
                     hit, timeout_s, prefix, spread, busy_poll_us):
    """:func:`run_load`'s steps (its arguments)."""
    from .actors import ModelRepository, Node, NodeConfig
    from .loadgen import GeneratorPool

    node = None
    url = nats_url
    try:
        if url is None:  # started inside the try: a SIGTERM during the start stops what has started
            node = Node(NodeConfig(models_dir=models_dir, workers=workers, ingress=ingress, nats_port=0, prefix=prefix,
                                   busy_poll_us=busy_poll_us))
            await node.start()
            await node.wait_ready(120)
            url = node.nats_url
        asked = version
        if nats_url is not None:
            version = await _served_default(url, prefix, model, version)
        m = ModelRepository(models_dir, [model]).get_version(model, version)
        mv = m.version(version) if m is not None else None
        if mv is None:  # the generators need the version's metadata (and its data, when it has some) from disk
            from .schemas import NotFound

            raise NotFound(f"model {model!r}" + (f" version {version!r}" if m is not None else "")
                           + f" is not in the model repository {models_dir} (--models), which bench reads for the "
                           f"inputs and reference answers" + (" of the deployment it benchmarks" if nats_url else ""),
                           field="model_version" if m is not None else "model")
        if asked is not None:  # (a served default was read from the deployment)
            await _check_served(url, prefix, model, mv.version)
        target = {"kind": "inferbus", "name": "inferbus", "model": model, "version": mv.version,
                  "distinct": not hit, "prefix": prefix, "timeout_ms": timeout_s * 1000}
        out = []
        async with GeneratorPool(gens, url, models_dir, spread=spread) as gp:
            await gp.prepare([target])
            await gp.step(target, mode="closed", concurrency=4, duration_s=min(1.0, duration_s), timeout_s=timeout_s)
            for c in concurrency:
                out.append(await gp.step(target, mode="closed", concurrency=c, duration_s=duration_s,
                                         timeout_s=timeout_s, label=model))
            for r in rates:
                out.append(await gp.step(target, mode="open", rate=r, duration_s=duration_s, timeout_s=timeout_s,
                                         label=model))
        from .bus import shown_servers

        for r in out:
            r.model_version, r.nats_url = mv.version, shown_servers(url)
        return out
    finally:
        if node is not None:
            await node.stop()

