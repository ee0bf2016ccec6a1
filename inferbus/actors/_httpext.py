"""Triton's statistics and model repository extensions on the node's HTTP port (``inferbus up --http-port``;
docs/http.md, "Statistics extension" and "Model repository extension").

Sources: Triton's protocol documents, https://github.com/triton-inference-server/server/blob/main/docs/protocol/
extension_statistics.md and extension_model_repository.md (the JSON shapes; no code taken).

==========================================================  ============================================================
``GET /v2/models[/<m>[/versions/<v>]]/stats``               per model version counts and times, summed over the node's
                                                            processes' ``$SRV.STATS`` (what a metrics scrape reads)
``POST /v2/repository/index``                               every model version of the node's repository folder and
                                                            every one its ingresses serve, with its state
``POST /v2/repository/models/<m>/load``                     ``<p>.models.<m>.load`` (:func:`~inferbus.model_admin.
                                                            model_control`); only with ``--http-model-control``
``POST /v2/repository/models/<m>/unload``                   ``<p>.models.<m>.unload`` of every served version, the
                                                            default last; only with ``--http-model-control``
==========================================================  ============================================================

Statistics are not kept for HTTP: the counts are those the Prometheus endpoint exports (the ingresses' per-model
forwards, cache hits and errors, the workers' per-model runs: :mod:`inferbus.actors._modelstats`), gathered the
same way (:func:`~inferbus.actors._metrics.gather_stats`) and mapped to Triton's fields by :func:`model_stats`, whose
docstring says which are exact, which derived and which are 0 because inferbus does not measure them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._gateway import HttpAnswer, error_answer, from_error

STATS_WAIT_S = 1.0
"""How long a statistics request waits for the node's actors' ``$SRV.STATS``, seconds (as a metrics scrape)."""

WRITE_TIMEOUT_S = 60.0
"""The budget of a load or unload without ``Inferbus-Timeout-Ms``, seconds (as ``inferbus models load``'s)."""

MAX_BODY_BYTES = 64 * 1024
"""The largest body of an index, load or unload request, bytes (Triton's ``file:`` parameters, which carry model
files, are refused anyway)."""

LOAD_PARAMETERS = ("version",)
"""The ``parameters`` a load accepts: ``version`` (an inferbus addition: load that version alone)."""

UNLOAD_PARAMETERS = ("version", "unload_dependents")
"""The ``parameters`` an unload accepts: ``version`` (an inferbus addition: unload that version alone) and Triton's
``unload_dependents`` (a boolean; no inferbus model loads others with it, so it changes nothing)."""

UNLOAD_ROUNDS = 5
"""How many times a whole-model unload reads the served versions again when its default's unload was refused
because loads served other versions meanwhile; past them (or the budget): UNAVAILABLE, 503 with ``Retry-After``."""

_JSON = (("Content-Type", "application/json"),)


def _done(replies) -> str:
    """``"versions 2, 1 were unloaded; "`` of a whole-model unload's writes so far (``""`` for none)."""
    return (f"versions {', '.join(r.version or '' for r in replies)} were unloaded; " if replies else "")


def _after(err, version: str, replies):
    """``err`` of a whole-model unload's write of ``version``, its message naming the writes done before it."""
    if not replies:
        return err
    new = type(err)(f"{err.message} (unloading version {version}, after {_done(replies)[:-2]})",
                    field=err.field, retry_after_ms=err.retry_after_ms)
    new.__cause__ = err
    return new



def _zero() -> dict:
    return {"count": 0, "ns": 0}


def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _int(v) -> int:
    return int(_number(v))


def _version_order(key: str) -> tuple:
    name, _, version = key.rpartition(":")
    return (name, len(version), version)


def model_stats(stats: dict[tuple[str, str], dict]) -> dict[str, dict]:
    """Triton's ``$model_stat`` of every model version the node's actors know, by ``"name:version"``, summed over
    their ``$SRV.STATS`` answers (``stats``: :func:`~inferbus.actors._metrics.gather_stats`'s).

    Exact, summed over the ingresses: ``inference_count`` and ``inference_stats.success.count`` (requests answered
    with a result: forwards that completed plus L1 and L2 cache hits; requests, not rows: Triton counts a batched
    request as its batch size), ``success.ns`` (the completed forwards' latency, forward to completion, µs × 1000;
    a cache hit's time is not measured and adds 0), ``fail.count`` (requests answered with a typed error, every
    code), ``cache_hit.count`` (L1 + L2 hits). Exact, summed over the workers: ``execution_count`` (model runs),
    ``compute_infer.count`` (requests computed) and ``.ns`` (each run's wall-clock compute once, µs × 1000: Triton
    charges each request of a batch the batch's time, so the two agree when every run computed one request,
    inferbus's default), ``batch_stats`` for batch sizes 1 and 2 (requests per run; the histogram's buckets above 2
    span several sizes and are not listed), their ``compute_infer.ns`` only when every run had that size (else 0).
    Derived: ``last_inference`` (ms since the epoch), the latest of the ingresses' last fold that counted a completed
    forward: at most one fold interval (50 ms) after it; cache hits do not move it; 0 before any. Not measured,
    given as 0: ``fail.ns``, ``queue``, ``compute_input``, ``compute_output``, ``cache_hit.ns``, ``cache_miss``.

    Every count is since its process started: a restarted worker's or ingress's start again at 0.
    """
    acc: dict[str, dict] = {}

    def entry(key) -> dict:
        e = acc.get(key)
        if e is None:
            e = acc[key] = {"ok": 0, "ok_us": 0.0, "last_ms": 0, "hits": 0, "fail": 0, "runs": 0, "computed": 0,
                            "compute_us": 0.0, "batch1": 0, "batch2": 0}
        return e

    for (kind, _), st in stats.items():
        data = next((e.get("data") for e in st.get("endpoints") or ()
                     if isinstance(e, dict) and e.get("name") == "infer"), None) or {}
        for key in data.get("models") or ():
            if isinstance(key, str) and ":" in key:
                entry(key)
        if kind == "ingress":
            for key, pm in (data.get("per_model") or {}).items():
                e, fwd = entry(key), pm.get("forward") or {}
                hits = _int(pm.get("l1_hits")) + _int(pm.get("l2_hits"))
                e["ok"] += _int(fwd.get("count")) + hits
                e["ok_us"] += _number(fwd.get("sum_us"))
                e["last_ms"] = max(e["last_ms"], _int(fwd.get("last_ms")))
                e["hits"] += hits
                e["fail"] += sum(_int(n) for n in (pm.get("errors") or {}).values())
        elif kind == "worker":
            for key, r in (data.get("runs") or {}).items():
                e, le = entry(key), r.get("batch_le") or []
                e["runs"] += _int(r.get("runs"))
                e["computed"] += _int(r.get("requests"))
                e["compute_us"] += _number(r.get("compute_sum_us"))
                if len(le) >= 2:
                    e["batch1"] += _int(le[0])
                    e["batch2"] += _int(le[1]) - _int(le[0])
    out = {}
    for key in sorted(acc, key=_version_order):
        e = acc[key]
        name, _, version = key.rpartition(":")
        compute_ns = round(e["compute_us"] * 1000)
        batch_stats = [{"batch_size": size, "compute_input": _zero(),
                        "compute_infer": {"count": n, "ns": compute_ns if n == e["runs"] else 0},
                        "compute_output": _zero()} for size, n in ((1, e["batch1"]), (2, e["batch2"])) if n > 0]
        out[key] = {
            "name": name, "version": version, "last_inference": e["last_ms"], "inference_count": e["ok"],
            "execution_count": e["runs"],
            "inference_stats": {"success": {"count": e["ok"], "ns": round(e["ok_us"] * 1000)},
                                "fail": {"count": e["fail"], "ns": 0}, "queue": _zero(), "compute_input": _zero(),
                                "compute_infer": {"count": e["computed"], "ns": compute_ns},
                                "compute_output": _zero(), "cache_hit": {"count": e["hits"], "ns": 0},
                                "cache_miss": _zero()},
            "batch_stats": batch_stats}
    return out


def statistics(gateway, name: str | None, version: str | None) -> HttpAnswer:
    """``GET /v2/models[/<name>[/versions/<version>]]/stats``: ``{"model_stats": [...]}`` (:func:`model_stats`) of
    every model version (no ``name``), every version of ``name``, or ``version`` of it, sorted by name and version.

    Waits :data:`STATS_WAIT_S` at most for the node's actors; when some of its ingresses or workers did not answer,
    the figures are those of the ones that did and the header ``Inferbus-Stats-Missing`` names the others.

    Returns:
        200; 400 for a name or version that cannot be one; 404 (``Inferbus-Error-Code: NOT_FOUND``) for a model or
        version no actor of the node knows; 503 when no ingress or worker of the node answered (NATS down, the node
        stopping); never raises.
    """
    from ..client import _subject_token, _version_token
    from ..schemas import InvalidArgument
    from ._metrics import gather_stats, node_actors

    try:
        if name is not None:
            _subject_token(name, "model")
        version = _version_token(version)
    except InvalidArgument as err:
        return from_error(err)

    async def ask(client):
        expected = node_actors(gateway.node)
        got = await gather_stats(client.nc, expected, STATS_WAIT_S)
        return expected, got

    def answer(result):
        expected, got = result
        counted = {(k, a) for k, a in expected.all() if k in ("ingress", "worker")}
        if not counted & got.keys():
            return error_answer(503, f"no ingress or worker of node {gateway.node.config.node_id} answered within "
                                     f"{STATS_WAIT_S:g} s: no statistics to give")
        per_key = model_stats(got)
        if name is not None:
            per_key = {k: v for k, v in per_key.items() if v["name"] == name}
            if not per_key:
                return error_answer(404, f"unknown model {name!r}", (("Inferbus-Error-Field", "model"),))
            if version is not None:
                per_key = {k: v for k, v in per_key.items() if v["version"] == version}
                if not per_key:
                    return error_answer(404, f"model {name!r} has no version {version!r}",
                                        (("Inferbus-Error-Field", "model_version"),))
        headers = _JSON
        missing = sorted(a for k, a in counted - got.keys())
        if missing:
            headers += (("Inferbus-Stats-Missing", ", ".join(missing)),)
        return HttpAnswer(200, json.dumps({"model_stats": list(per_key.values())}).encode(), headers)

    return gateway.run_then(ask, STATS_WAIT_S, answer)


# ---------------------------------------------------------------------------------------------- repository


def _request_object(body: bytes, allowed: tuple[str, ...]) -> dict:
    """The JSON object of an index, load or unload body (``{}`` for an empty one).

    Read with the ingress's JSON decoder (:func:`inferbus.schemas.decode`): a body nested too deeply is its 400
    (``the request body is nested too deeply to decode ...``); until 2026-12-07 ``json.loads`` raised RecursionError
    past ~1,000 levels, a 500 and a traceback in the node's log.

    Raises:
        InvalidArgument: not JSON (malformed, nested too deeply: the ingress's words), not an object, or a key not
            in ``allowed`` (named).
    """
    from typing import Any

    from ..schemas import JSON, InvalidArgument, decode

    if not body.strip():
        return {}
    doc = decode(body, Any, JSON, what="request")
    if not isinstance(doc, dict):
        raise InvalidArgument("the body must be a JSON object", field="body")
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise InvalidArgument(f"unknown field {unknown[0]!r}; the body's fields are: {', '.join(allowed)}",
                              field=unknown[0])
    return doc


VERSION_FIELD = "parameters.version"
"""The ``Inferbus-Error-Field`` of every refusal of a load's or unload's version: the body's field the HTTP client
sent, whatever names it on the way (the NATS write's ``version``, docs/models.md; the SDK's ``model_version``)."""


def _json_text(value, limit: int = 40) -> str:
    """``value`` as JSON spells it (``true``, ``null``, ``"x"``, ``1.0``), at most ``limit`` characters (then
    ``...``): the HTTP client's own words in a refusal, not Python's (``True``, ``None``, ``'x'``)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def _version_parameter(v) -> str:
    """``parameters.version`` as the NATS write carries it (``2`` → ``"2"``), else InvalidArgument (field
    :data:`VERSION_FIELD`, the value as JSON spells it): not a string of ASCII digits or an integer >= 0, a leading
    zero (``"01"``), or over the largest version (2**63 - 1), as the SDK and the ingress refuse them."""
    from ..bus._subjects import MAX_VERSION, leading_zero_fix, version_problem
    from ..schemas import InvalidArgument

    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise InvalidArgument(f"parameters.version must be a version number (a string of digits or an integer >= 0), "
                              f"got {_json_text(v)}", field=VERSION_FIELD)
    text = str(v) if isinstance(v, int) and v >= 0 else v
    if not (isinstance(text, str) and text.isascii() and text.isdigit()):
        raise InvalidArgument(f"parameters.version {_json_text(v)} is not a number: versions are named by "
                              f"their folders' decimal numbers (e.g. \"1\"); send a string of digits or an integer "
                              f">= 0", field=VERSION_FIELD)
    fix = leading_zero_fix(text)
    if fix is not None:
        raise InvalidArgument(f"parameters.version {_json_text(v)} has a leading zero: write it {_json_text(fix)} "
                              f"(version folders are numbers without leading zeros)", field=VERSION_FIELD)
    if version_problem(text) is not None:  # (what is left: over the largest)
        raise InvalidArgument(f"parameters.version {_json_text(v)} is over the largest version, {MAX_VERSION}: "
                              f"versions are 64-bit integers, as Triton's are", field=VERSION_FIELD)
    return text


def _parameters(doc: dict, allowed: tuple[str, ...], op: str) -> dict:
    """``doc["parameters"]`` checked against ``allowed``; the messages spell values as JSON does.

    Raises:
        InvalidArgument: not an object; Triton's ``config`` or ``file:<path>`` (inferbus loads from its repository
            folder); any other name not in ``allowed``; ``version`` not a version's decimal number (a string of
            digits or an integer >= 0: :func:`_version_parameter`, field :data:`VERSION_FIELD`);
            ``unload_dependents`` not a boolean.
    """
    from ..schemas import InvalidArgument

    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidArgument("parameters must be a JSON object", field="parameters")
    for key, value in params.items():
        if key == "config" or key.startswith("file:"):
            raise InvalidArgument(f"parameter {key!r} is not supported: inferbus loads a model from its repository "
                                  f"folder (edit it there, then load); the {op} parameters are: "
                                  f"{', '.join(allowed)}", field=f"parameters.{key}")
        if key not in allowed:
            raise InvalidArgument(f"unknown parameter {key!r}; the {op} parameters are: {', '.join(allowed)}",
                                  field=f"parameters.{key}")
        if key == "unload_dependents" and not isinstance(value, bool):
            raise InvalidArgument(f"parameters.unload_dependents must be true or false, got {_json_text(value)}",
                                  field="parameters.unload_dependents")
    if "version" in params:
        params = {**params, "version": _version_parameter(params["version"])}
    return params


def repository_on_disk(models_dir: str, only: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """The models of the repository folder ``models_dir`` (folders with a ``config.json``; only those in ``only``
    when given) and their versions on disk (``<digits>/model.onnx``), sorted by number. Blocking (reads the folder);
    an unreadable folder counts as empty."""
    out: dict[str, list[str]] = {}
    try:
        folders = sorted(p.parent for p in Path(models_dir).glob("*/config.json"))
    except OSError:
        return out
    for folder in folders:
        if only and folder.name not in only:
            continue
        try:
            versions = [d.name for d in folder.iterdir() if d.name.isascii() and d.name.isdigit()
                        and (d / "model.onnx").is_file()]
        except OSError:
            versions = []
        out[folder.name] = sorted(versions, key=lambda v: (len(v), v))
    return out


def repository_index(gateway, body: bytes) -> HttpAnswer:
    """``POST /v2/repository/index``: ``[{"name", "version", "state", "reason"}]``, one per model version on the
    node's repository folder or served by its ingresses, sorted by name and version.

    ``state``: ``READY`` for a version the ingresses serve (its metadata lists it) unless no live worker serves it
    (``UNAVAILABLE``, ``reason`` the ingress's), ``UNAVAILABLE`` with ``reason`` ``unloaded`` for one on disk that
    is not served (never loaded under its ``version_policy``, or unloaded); a model folder without any version:
    one entry with ``version`` ``""``. Body (optional): ``{"ready": true}`` lists the ``READY`` ones alone;
    ``repository_name`` is accepted and not read (one repository per node).

    Returns:
        200; 400 for a malformed body; 503/504 when no ingress answers within 1 s. Never raises.
    """
    from ..schemas import InferbusError, InvalidArgument

    try:
        doc = _request_object(body, ("repository_name", "ready"))
        if not isinstance(doc.get("ready", False), bool):
            raise InvalidArgument(f"ready must be true or false, got {_json_text(doc['ready'])}", field="ready")
        if not isinstance(doc.get("repository_name", ""), str):
            raise InvalidArgument("repository_name must be a string", field="repository_name")
    except InferbusError as err:
        return from_error(err)
    config = gateway.node.config
    on_disk = repository_on_disk(config.models_dir, tuple(config.models))  # (this thread: not the node's loop)

    async def ask(client):
        return await client.models(timeout_s=1.0)

    def answer(served):
        entries: dict[tuple[str, str], dict] = {}
        for name, versions in on_disk.items():
            for v in versions or [""]:
                entries[name, v] = {"name": name, "version": v, "state": "UNAVAILABLE",
                                    "reason": "unloaded" if v else "no version on disk (<version>/model.onnx)"}
        for m in served.models:
            problems = (m.parameters or {}).get("versions_not_served") or {}
            entries.pop((m.name, ""), None)
            for v in m.versions:
                p = problems.get(v) or {}
                why = next(iter((p.get("workers") or {}).values()), "no live worker serves it")
                entries[m.name, v] = {"name": m.name, "version": v, "state": "READY" if not p or p.get("ready")
                                      else "UNAVAILABLE", "reason": "" if not p or p.get("ready") else why}
        rows = [entries[k] for k in sorted(entries, key=lambda k: (k[0], len(k[1]), k[1]))]
        if doc.get("ready"):
            rows = [r for r in rows if r["state"] == "READY"]
        return HttpAnswer(200, json.dumps(rows).encode(), _JSON)

    return gateway.run_then(ask, 1.0, answer)


def repository_write(gateway, op: str, name: str, body: bytes, timeout_ms: str | None) -> HttpAnswer:
    """``POST /v2/repository/models/<name>/load`` (``op`` ``load``) or ``.../unload`` (``unload``) through the
    ingresses' model-management writes (docs/models.md), answered when they are done.

    load: ``<p>.models.<name>.load``: every version on disk not served yet that the model's ``version_policy``
    serves (``parameters.version``: that version alone, whatever the policy); a model fully served: nothing to do,
    200 (Triton reloads it: inferbus never reloads a served version; unload it, then load). unload without
    ``parameters.version``: the whole model, as Triton's: every served version but the default, one write each,
    then the default (its last version: the model is withdrawn, NOT_FOUND to requests, until a load); a model not
    served but on disk: nothing to do, 200 (Triton's unload of an unloaded model succeeds); idempotent under
    concurrency: a version another unload took meanwhile (NOT_FOUND) counts as done, and the default's unload refused
    because a load served other versions since they were read reads the served versions again (at most
    :data:`UNLOAD_ROUNDS` rounds, within the budget). unload with
    ``parameters.version``: that version alone (the default refused while others are served, as over NATS);
    idempotent as the whole-model unload: a version not served (unloaded already, by this request's earlier try or
    another) of a model that is served, or of a model not served but on this node's disk, is nothing to do, 200 with
    ``writes`` empty (whether that version ever existed is not told: the ingresses forget an unloaded version, and
    another node's folder may have held it).

    Args:
        timeout_ms: the ``Inferbus-Timeout-Ms`` header (the whole budget, ms; every write of an unload within it),
            None: :data:`WRITE_TIMEOUT_S`.

    Returns:
        200 with ``{"name", "versions" (served after it), "default_version", "revision", "writes": [{"op",
        "version", "changed", "elapsed_ms"}]}``; the write's typed error as HTTP otherwise (:func:`from_error`):
        400 (a malformed body, an unknown or unsupported parameter, the default version named while others are
        served), 404 (a model neither served nor on disk; a load's version not on disk), 500 (no
        worker could load it), 503 (writes refused in a standby region, naming the primary; no ingress answered; a
        whole-model unload whose default's unload was refused :data:`UNLOAD_ROUNDS` times as loads served other
        versions meanwhile, with ``Retry-After``), 504
        (the budget ran out; it may still be applied: the message says so). A failure after some writes of an
        unload names the versions already unloaded. Never raises.
    """
    import time

    from ..bus import _headers as H
    from ..client import _subject_token
    from ..model_admin import model_control
    from ..schemas import DeadlineExceeded, InferbusError, InvalidArgument, NotFound, Unavailable

    t0 = time.monotonic()
    try:
        _subject_token(name, "model")
        allowed = LOAD_PARAMETERS if op == "load" else UNLOAD_PARAMETERS
        params = _parameters(_request_object(body, ("parameters",)), allowed, op)
        budget_ms = H.budget_ms(timeout_ms, WRITE_TIMEOUT_S * 1000, strict=True)
        if budget_ms <= 0:
            raise DeadlineExceeded(f"the request's budget ({H.TIMEOUT_MS}) was already spent on arrival")
    except InferbusError as err:
        return from_error(err)
    version = params.get("version")
    budget_s = budget_ms / 1000.0
    on_disk = name in repository_on_disk(gateway.node.config.models_dir, tuple(gateway.node.config.models))

    def left() -> float:
        return max(budget_s - (time.monotonic() - t0), 0.001)

    async def ask(client):
        if op == "load":
            return [await model_control(client, op, name, version, timeout_s=left())]
        if version is not None:
            try:
                return [await model_control(client, op, name, version, timeout_s=left())]
            except NotFound as err:
                # idempotent, as the whole-model unload: the version is not served (field version: the model is;
                # field model: the model is not, and it is known here when it is on disk), so what this request
                # asks for holds; 404 only for a model neither served nor on this node's disk
                if err.field == "version" or (err.field == "model" and on_disk):
                    try:
                        return await client.model(name, timeout_s=min(left(), 5.0)) if err.field == "version" else []
                    except NotFound:  # (withdrawn meanwhile: nothing served)
                        return []
                raise
        replies = []
        refused = None
        for _ in range(UNLOAD_ROUNDS):
            try:
                meta = await client.model(name, timeout_s=min(left(), 5.0))
            except NotFound:
                if on_disk or replies or refused is not None:  # not served (any more): nothing (more) to do
                    return replies
                raise
            default = str((meta.parameters or {}).get("default_version", ""))
            order = [v for v in meta.versions if v != default] + [v for v in meta.versions if v == default]
            refused = None
            for v in order:
                try:
                    replies.append(await model_control(client, "unload", name, v, timeout_s=left()))
                except NotFound as err:
                    # another unload took that version (field version) or the whole model (field model) meanwhile:
                    # what this request asks for is done for it
                    if err.field in ("version", "model"):
                        continue
                    raise _after(err, v, replies)
                except InvalidArgument as err:
                    # the default refused while others are served: a load served them since the versions were
                    # read; read them again (another round) rather than answer a 400 about a version not named
                    if v == default and err.field == "version":
                        refused = err
                        break
                    raise _after(err, v, replies)
                except InferbusError as err:
                    raise _after(err, v, replies)
            if refused is None:
                return replies
            if budget_s - (time.monotonic() - t0) < 0.05:
                break
        raise Unavailable(f"unloading {name!r}: versions were loaded again while it was being unloaded, "
                          f"{UNLOAD_ROUNDS} rounds (the last refusal: {refused.message}); "
                          f"{_done(replies)}retry the unload", retry_after_ms=1000)

    async def ask_as_sent(client):
        try:
            return await ask(client)
        except InferbusError as err:
            # a refusal of the version this request named (the NATS write's field version: not on disk, the default
            # while others are served, no worker could load it): named as the HTTP client sent it. A whole-model
            # write's refusal of a version the client did not name keeps the NATS field (and says the version)
            if version is None or err.field not in ("version", "model_version"):
                raise
            renamed = type(err)(err.message, field=VERSION_FIELD, retry_after_ms=err.retry_after_ms)
            raise renamed from err

    def answer(replies):
        if not isinstance(replies, list):  # a version-specific unload with nothing to do: the model's metadata
            meta = replies
            doc = {"name": name, "versions": list(meta.versions),
                   "default_version": str((meta.parameters or {}).get("default_version", "")), "revision": None,
                   "writes": []}
            return HttpAnswer(200, json.dumps(doc).encode(), _JSON)
        last = replies[-1] if replies else None
        doc = {"name": name, "versions": list(last.versions) if last else [],
               "default_version": last.default_version if last else "", "revision": last.revision if last else None,
               "writes": [{"op": r.op, "version": r.version, "changed": r.changed, "elapsed_ms": r.elapsed_ms}
                          for r in replies]}
        return HttpAnswer(200, json.dumps(doc).encode(), _JSON)

    return gateway.run_then(ask_as_sent, budget_s - (time.monotonic() - t0), answer)


__all__ = ["LOAD_PARAMETERS", "MAX_BODY_BYTES", "STATS_WAIT_S", "UNLOAD_PARAMETERS", "UNLOAD_ROUNDS", "VERSION_FIELD",
           "WRITE_TIMEOUT_S", "model_stats", "repository_index", "repository_on_disk", "repository_write", "statistics"]
