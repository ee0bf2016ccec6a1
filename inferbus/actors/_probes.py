"""The node's health over HTTP, beside ``/metrics`` (``inferbus up --metrics-port``; docs/observability.md), and the
node's WSGI app, which routes ``/v2`` paths to these probes and to the OIP v2 REST metadata and inference of
:mod:`inferbus.actors._gateway` (docs/http.md).

The KServe Open Inference Protocol v2 HTTP/REST health API, as Triton's HTTP port serves it (source: the protocol,
https://kserve.github.io/website/docs/concepts/architecture/data-plane/v2-protocol, "Health"):

==============================================  ==================================================================
``GET /v2/health/live``                         200 while the node process runs, serves HTTP and its event loop
                                                (the supervisor's) answers within the bound
``GET /v2/health/ready``                        200 when one of this node's ingresses says it is ready
``GET /v2/models/<name>/ready``                 200 when one of them says the model's default version is ready
``GET /v2/models/<name>/versions/<v>/ready``    the same for version ``<v>``
==============================================  ==================================================================

The answer is the status code, as the protocol says (the body of a 200 is empty). Not true is **503** for "not
ready" or "cannot tell within the bound" (the protocol says "4xx", Triton answers 400: every prober reads both as
a failure, and 503 keeps "not ready" apart from a malformed request), **404** for a model or version this node does
not serve, **400** for a name or version that cannot be one (``a.b``, ``v1``, ``01``); those carry the OIP v2 error
body ``{"error": "<why>"}``. ``HEAD`` answers what ``GET`` does without a body; ``HEAD`` on ``/metrics`` (any path
outside ``/v2/``) runs the scrape and answers its status and headers, where prometheus-client's app answered 405.

Readiness is asked, not inferred: the node sends each of its running ingress processes (its supervisor's view:
:meth:`Node.running_ingress_ids`) the same NATS request ``inferbus health --ingress <id>`` and
:meth:`Client.model_ready` send (``<p>.ingresses.<id>.health``, ``<p>.ingresses.<id>.models.<name>[.<version>]
.ready``), on the node's own connection, all at once; the first "ready" answers 200. So ready means what the
ingress's OIP v2 health says over NATS: a live worker (a load report within ``--health-timeout-s``, not draining,
breaker not open) for the default version of every served model, which the ingress can read. A worker of another node
on the same NATS counts: requests through this node's ingresses are answered by it.

Time bound: each ingress gets :data:`PROBE_WAIT_S` (0.5 s) to answer, and the HTTP thread waits
:data:`PROBE_BOUND_S` (1 s) at most for the node's event loop, so a probe answers within about 1 s whatever the
bus does (NATS stopped or partitioned, an ingress frozen): 503 then, naming what did not answer. A probe costs each
running ingress of the node one health (or model-ready) answer, built on its event loop from what it keeps anyway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import re
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable

_log = logging.getLogger(__name__)

PROBE_WAIT_S = 0.5
"""How long a readiness probe waits for the node's ingresses to answer, seconds."""

PROBE_BOUND_S = 1.0
"""The longest a probe's HTTP answer waits for the node's event loop, seconds; past it the probe answers 503."""


class LoopCalls:
    """The HTTP threads' calls on the node's event loop that are under way (:func:`on_node_loop`'s), so that the
    node's graceful stop can end those its drain did not see answered: :meth:`close` cancels them (each answers
    ``stopped``: 503) and refuses any later one at once. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: set[concurrent.futures.Future] = set()
        self.closed = False

    def add(self, fut: concurrent.futures.Future) -> bool:
        """Track ``fut``; False (not tracked) once :meth:`close` was called."""
        with self._lock:
            if self.closed:
                return False
            self._futures.add(fut)
            return True

    def discard(self, fut: concurrent.futures.Future) -> None:
        with self._lock:
            self._futures.discard(fut)

    def close(self) -> int:
        """Cancel every call under way (its coroutine is cancelled on the loop) and refuse the later ones; returns
        how many were cancelled. Idempotent."""
        with self._lock:
            self.closed = True
            futures, self._futures = self._futures, set()
        return sum(1 for f in futures if f.cancel())


_STOPPED_TEXT = "the node is stopping: the request was not answered within its stop's drain"


def on_node_loop(loop: asyncio.AbstractEventLoop, coro, wait_s: float, failed: Callable[[str, str], object],
                 calls: LoopCalls | None = None):
    """What ``coro`` returns, run on the node's ``loop`` from an HTTP server thread and waited for ``wait_s`` seconds
    at most; else ``failed(why, text)``: ``why`` is ``stopped`` (the loop is closed: the node has stopped; or
    ``calls`` was closed, before or during the run, by the node's stop; ``coro`` closed unrun, or its run
    cancelled), ``timeout`` (no answer in time; the run cancelled) or ``bug`` (it raised: the coroutines catch
    what they expect), ``text`` says so in words. Never raises."""
    if calls is not None and calls.closed:
        coro.close()
        return failed("stopped", _STOPPED_TEXT)
    try:
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError as exc:
        coro.close()
        return failed("stopped", f"the node is not running ({exc})")
    if calls is not None and not calls.add(fut):
        fut.cancel()
        return failed("stopped", _STOPPED_TEXT)
    try:
        return fut.result(wait_s)
    except concurrent.futures.CancelledError:  # (an Exception, not asyncio's BaseException: before the catch-all)
        return failed("stopped", _STOPPED_TEXT)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        return failed("timeout", f"the node's event loop did not answer within {wait_s:.3g} s")
    except Exception as exc:
        return failed("bug", f"failed: {exc!r}")
    finally:
        if calls is not None:
            calls.discard(fut)


@dataclass(frozen=True)
class ProbeAnswer:
    """One probe's verdict.

    Attributes:
        status: the HTTP status code: 200 (true), 400, 404 or 503 (module docstring).
        reason: why it is not 200, for the body's ``error`` ("" for 200).
        field: the field a 400 names (``model``, ``model_version``), sent as ``Inferbus-Error-Field`` as the
            gateway's errors do; None: none.
    """

    status: int
    reason: str = ""
    field: str | None = None


OK = ProbeAnswer(200)


class NodeProbes:
    """OIP v2 live/ready of one running :class:`~inferbus.actors.Node`, asked from the HTTP server's threads.

    Each method blocks its calling thread (never the node's loop) for at most ``bound_s`` seconds and never raises:
    whatever goes wrong is a 503 with the reason.

    Args:
        node: the node (its ``nc``, ``config.prefix``, :meth:`running_ingress_ids`, ``stopping``).
        loop: the node's event loop (where its NATS connection works).
        wait_s: how long the ingresses get to answer, seconds (default :data:`PROBE_WAIT_S`, 0.5).
        bound_s: the longest a call waits for the loop, seconds (default :data:`PROBE_BOUND_S`, 1.0; more than
            ``wait_s``).
    """

    def __init__(self, node, loop: asyncio.AbstractEventLoop, wait_s: float = PROBE_WAIT_S,
                 bound_s: float = PROBE_BOUND_S) -> None:
        if not 0 < wait_s < bound_s:
            raise ValueError(f"NodeProbes needs 0 < wait_s < bound_s, got wait_s={wait_s!r}, bound_s={bound_s!r}")
        self.node = node
        self.loop = loop
        self.wait_s = wait_s
        self.bound_s = bound_s
        self._client = None

    def live(self) -> ProbeAnswer:
        """200 when the node's event loop runs a no-op within ``bound_s`` (the bus is not asked), else 503."""
        return self._run(self._live)

    def ready(self) -> ProbeAnswer:
        """200 when one of the node's running ingresses answers its health with ``ready: true`` within ``wait_s``;
        else 503 (the node stopping, no ingress process running, no NATS connection, each ingress's answer or
        silence)."""
        return self._run(self._ready)

    def model_ready(self, name: str, version: str | None = None) -> ProbeAnswer:
        """200 when one of the node's running ingresses says ``version`` of model ``name`` (None: its default
        version) is ready; 404 when they answered that they serve no such model or version; 400 when ``name``
        cannot be a model name (one NATS subject token) or ``version`` is not a version's decimal number (checked
        before anything is sent); else 503, as :meth:`ready`."""
        from ..client import _subject_token, _version_token
        from ..schemas import InvalidArgument

        try:
            _subject_token(name, "model")
            _version_token(version)
        except InvalidArgument as err:
            return ProbeAnswer(400, err.message, err.field)
        return self._run(functools.partial(self._model_ready, name, version))

    def _run(self, make: Callable[[], Awaitable[ProbeAnswer]]) -> ProbeAnswer:
        return on_node_loop(self.loop, make(), self.bound_s, lambda why, text: ProbeAnswer(503, text if why != "bug"
                                                                                          else f"the probe {text}"),
                            getattr(self.node, "http_calls", None))

    async def _live(self) -> ProbeAnswer:
        return OK

    def _cannot_ask(self) -> tuple[list[str], ProbeAnswer | None]:
        """``(ingress ids to ask, None)``, or ``([], the answer)`` when there is no one to ask."""
        node = self.node
        if node.stopping:
            return [], ProbeAnswer(503, f"node {node.config.node_id} is stopping")
        ids = node.running_ingress_ids()
        if not ids:
            return [], ProbeAnswer(503, f"no ingress process of node {node.config.node_id} is running")
        nc = node.nc
        if nc is None or not nc.is_connected:
            return [], ProbeAnswer(503, f"node {node.config.node_id} is not connected to NATS (its ingresses cannot "
                                        "be asked)")
        return ids, None

    def _client_for(self, nc):
        from ..client import Client

        if self._client is None or self._client.nc is not nc:  # (made on the loop: it keeps the loop it runs on)
            # one attempt per ingress and probe, given the whole wait: a slow ingress gets no second request to queue
            self._client = Client(nc, self.node.config.prefix, retry_unavailable=False,
                                  adaptive_attempt_timeout=False)
        return self._client

    async def _ask_each(self, ids: list[str], ask, is_yes: Callable[[object], bool]) -> tuple[str | None, dict]:
        """Ask every ingress of ``ids`` at once (``ask(client, id)``, a coroutine); return as soon as one answer
        ``is_yes``, or when all have answered or failed. Returns ``(the id that said yes or None, {id: answer or
        exception})`` (an id that has not answered when one said yes is missing)."""
        client = self._client_for(self.node.nc)
        tasks = {asyncio.ensure_future(ask(client, i)): i for i in ids}
        results: dict[str, object] = {}
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, timeout=self.wait_s + 0.1,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:  # (each request has wait_s: a backstop)
                    break
                for t in done:
                    i = tasks[t]
                    results[i] = t.exception() or t.result()
                    if is_yes(results[i]):
                        return i, results
        finally:
            for t in pending:
                t.cancel()
        for t in pending:
            results.setdefault(tasks[t], TimeoutError(f"no answer within {self.wait_s:g} s"))
        return None, results

    @staticmethod
    def _said(answer: object) -> str:
        """An ingress's answer or failure, in a few words."""
        if isinstance(answer, BaseException):
            code = getattr(getattr(answer, "code", None), "value", None)
            return f"{code or type(answer).__name__}: {getattr(answer, 'message', None) or answer}"
        return str(answer)

    async def _ready(self) -> ProbeAnswer:
        ids, no = self._cannot_ask()
        if no is not None:
            return no
        winner, results = await self._ask_each(
            ids, lambda c, i: c.health(timeout_s=self.wait_s, ingress=i), lambda h: getattr(h, "ready", False) is True)
        if winner is not None:
            return OK
        why = []
        for i in ids:
            h = results.get(i)
            if hasattr(h, "ready"):
                p = h.parameters
                why.append(f"{i}: not ready (model versions with a live worker: "
                           f"{', '.join(p.get('models_ready') or ()) or 'none'}; live workers: "
                           f"{p.get('workers_live', '?')})")
            else:
                why.append(f"{i}: {self._said(h)}")
        return ProbeAnswer(503, f"no ingress of node {self.node.config.node_id} is ready: {'; '.join(why)}")

    async def _model_ready(self, name: str, version: str | None) -> ProbeAnswer:
        from ..schemas import InvalidArgument, NotFound

        ids, no = self._cannot_ask()
        if no is not None:
            return no
        winner, results = await self._ask_each(
            ids, lambda c, i: c.model_ready(name, version, timeout_s=self.wait_s, ingress=i), lambda r: r is True)
        if winner is not None:
            return OK
        what = f"model {name!r} " + (f"version {version}" if version is not None else "(its default version)")
        not_ready = [i for i, r in results.items() if r is False]
        if not_ready:
            return ProbeAnswer(503, f"{what} is not ready at {', '.join(not_ready)}: no live worker whose breaker is "
                                    "not open serves it")
        for kind, status in ((NotFound, 404), (InvalidArgument, 400)):
            err = next((r for r in results.values() if isinstance(r, kind)), None)
            if err is not None:
                return ProbeAnswer(status, err.message)
        return ProbeAnswer(503, f"{what}: no ingress of node {self.node.config.node_id} answered: "
                                f"{'; '.join(f'{i}: {self._said(r)}' for i, r in results.items())}")


def _route(path: str, probes: NodeProbes, gateway) -> tuple[tuple[str, ...], Callable, Callable | None] | None:
    """``(the methods the path answers, its handler, its target's check)`` for a path under ``/v2``, None for an
    unknown one. A handler takes ``(environ, started_at)`` and returns a :class:`ProbeAnswer` or an
    :class:`~inferbus.actors._gateway.HttpAnswer`; so does the check, whose 400 or 404 says that the path's model or
    version cannot be one or does not exist (what ``OPTIONS`` answers then, as ``GET`` would), None for a path that
    always exists (``/v2``, the health paths, ``/v2/models/stats``, the repository index). A ``GET`` path's check is
    its handler; ``infer``'s the model metadata; ``load``'s and ``unload``'s the write's own 404 rule (a model on this
    node's disk or served). Without ``gateway`` only the health paths are known."""
    parts = path.split("/")[2:]  # "/v2/health/live" -> ["health", "live"]
    if parts == ["health", "live"]:
        return ("GET", "HEAD"), lambda env, t0: probes.live(), None
    if parts == ["health", "ready"]:
        return ("GET", "HEAD"), lambda env, t0: probes.ready(), None
    name = version = None
    if len(parts) >= 2 and parts[0] == "models":
        name, rest = parts[1], parts[2:]
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        if rest == ["ready"]:
            ready = lambda env, t0: probes.model_ready(name, version)  # noqa: E731
            return ("GET", "HEAD"), ready, ready
    else:
        rest = None
    if gateway is None:
        return None
    from . import _httpext as ext

    if parts in ([], [""]):
        return ("GET", "HEAD"), lambda env, t0: gateway.server_metadata(), None
    if parts == ["models", "stats"]:  # (before the metadata of a model named "stats", as Triton's)
        return ("GET", "HEAD"), lambda env, t0: ext.statistics(gateway, None, None), None
    if rest == []:
        metadata = lambda env, t0: gateway.model_metadata(name, version)  # noqa: E731
        return ("GET", "HEAD"), metadata, metadata
    if rest == ["infer"]:
        return (("POST",), lambda env, t0: _infer(gateway, name, version, env, t0),
                lambda env, t0: gateway.model_metadata(name, version))
    if rest == ["stats"]:
        stats = lambda env, t0: ext.statistics(gateway, name, version)  # noqa: E731
        return ("GET", "HEAD"), stats, stats
    if parts == ["repository", "index"]:
        return ("POST",), lambda env, t0: _repository(gateway, None, None, env), None
    if len(parts) == 4 and parts[:2] == ["repository", "models"] and parts[3] in ("load", "unload"):
        return (("POST",), lambda env, t0: _repository(gateway, parts[3], parts[2], env),
                lambda env, t0: _repository_model(gateway, parts[2]))
    return None


def _repository_model(gateway, name: str):
    """The check of ``/v2/repository/models/<name>/load|unload`` (:func:`_route`): 400 for a name that cannot be
    one, 200 for a model in this node's repository folder, else the model metadata's answer (404 for a model no
    ingress serves): the writes' own rule for a model that does not exist (neither on disk nor served)."""
    from . import _httpext as ext
    from ._gateway import HttpAnswer

    config = gateway.node.config
    if name in ext.repository_on_disk(config.models_dir, tuple(config.models)):  # (this thread: not the node's loop)
        return HttpAnswer(200)
    return gateway.model_metadata(name, None)


def _content_length(environ, limit: int, what: str, required: bool):
    """The request's ``Content-Length`` (0 when absent and not ``required``), or the error answer: 411 (absent and
    ``required``), 400 (not digits), 413 (over ``limit`` bytes, 0: no limit)."""
    from ._gateway import error_answer

    length = environ.get("CONTENT_LENGTH") or ""
    if not length.strip():
        return error_answer(411, f"{what} needs a Content-Length or a chunked body") if required else 0
    digits = length.strip()  # 1*DIGIT (RFC 9110): int() also took "1_0", "+10" and non-ASCII digits
    n = int(digits) if digits.isascii() and digits.isdigit() else -1
    if n < 0:
        return error_answer(400, f"Content-Length must be a number of bytes, got {length[:40]!r}")
    if limit and n > limit:
        return error_answer(413, f"request body of {n} bytes is over the limit of {limit}" + (
            " (the ingresses' --max-request-bytes, else the NATS server's max_payload)" if required else ""))
    return n


def _read_body(environ, n: int):
    """``n`` bytes of the body (the HTTP server has read it whole already, a chunked one too), or a 400 answer when
    it is shorter."""
    from ._gateway import error_answer

    body = environ["wsgi.input"].read(n) if n else b""
    if len(body) < n:
        return error_answer(400, f"the body ended after {len(body)} of its Content-Length's {n} bytes")
    return body


def _repository(gateway, op: str | None, name: str | None, environ):
    """Serve ``POST /v2/repository/index`` (``op`` None) or ``.../models/<name>/load|unload`` (``op``): the body
    (optional, at most :data:`~inferbus.actors._httpext.MAX_BODY_BYTES`) to :mod:`~inferbus.actors._httpext`; a
    write is 403 unless the node runs with ``--http-model-control``."""
    from . import _httpext as ext
    from ._gateway import HttpAnswer, error_answer

    n = _content_length(environ, ext.MAX_BODY_BYTES, "a repository request", False)
    if isinstance(n, HttpAnswer):
        return n
    if op is not None and not gateway.model_control_enabled:
        return error_answer(403, f"model {op} over HTTP is off on this node: start it with --http-model-control (the "
                                 "HTTP port has no authentication; docs/http.md), or use `inferbus models "
                                 f"{op}` over NATS")
    body = _read_body(environ, n)
    if isinstance(body, HttpAnswer):
        return body
    if op is None:
        return ext.repository_index(gateway, body)
    return ext.repository_write(gateway, op, name, body, environ.get("HTTP_INFERBUS_TIMEOUT_MS"))


def _infer(gateway, name: str, version: str | None, environ, started_at: float):
    """Serve a ``POST .../infer``: its body (``Content-Length`` bytes, at most the gateway's limit; the HTTP server
    has read it whole already, a chunked one too) to the gateway."""
    from ._gateway import HttpAnswer, error_answer

    n = _content_length(environ, gateway.max_body_bytes(), "an inference request", True)
    if isinstance(n, HttpAnswer):
        return n
    if not gateway.infer_enabled:
        return error_answer(403, "inference over HTTP is off on this node: start it with --http-infer (the HTTP "
                                 "port has no authentication; docs/http.md), or send the request over NATS")
    body = _read_body(environ, n)
    if isinstance(body, HttpAnswer):
        return body
    headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    return gateway.infer(name, version, body, headers, started_at=started_at)


_PROBE_PATHS = ("/v2/health/live, /v2/health/ready, /v2/models/<name>/ready, "
                "/v2/models/<name>/versions/<version>/ready")
_GATEWAY_PATHS = ("/v2, /v2/models/<name>[/versions/<version>], POST /v2/models/<name>[/versions/<version>]/infer, "
                  "/v2/models[/<name>[/versions/<version>]]/stats, POST /v2/repository/index, "
                  "POST /v2/repository/models/<name>/load|unload, "
                  + _PROBE_PATHS.replace("/v2/models/<name>/ready, /v2/models/<name>/versions/<version>/ready",
                                         "/v2/models/<name>[/versions/<version>]/ready"))


def _answer(start_response, method: str, answer, extra_headers: tuple = ()) -> list[bytes]:
    """Write a :class:`ProbeAnswer` (its body empty for 200, ``{"error": reason}`` otherwise) or an
    :class:`~inferbus.actors._gateway.HttpAnswer` (its body and headers as they are)."""
    from ._gateway import HttpAnswer, error_answer, status_line

    if isinstance(answer, ProbeAnswer):  # (an error's with Inferbus-Error-Code, as the gateway's)
        answer = HttpAnswer(200) if answer.status == 200 else error_answer(
            answer.status, answer.reason, (("Inferbus-Error-Field", answer.field),) if answer.field else ())
    body, headers = answer.body, list(answer.headers)
    headers += [*extra_headers, ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
    start_response(status_line(answer.status), headers)
    return [] if method == "HEAD" else [body]


_ABSOLUTE_FORM = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A request-target in absolute-form (``http://host/path``, RFC 9112 3.2.2), which a server takes as its path."""

SERVER_METHODS = "OPTIONS, GET, HEAD, POST"
"""The methods some path of this server answers (the ``Allow`` of a 405 to ``CONNECT``, of ``OPTIONS *``)."""


def _target_refusal(method: str, target: str | None):
    """The answer to a request whose request-target is not a path (RFC 9112 3.2: origin-form ``/...``, or
    absolute-form ``http://host/...``, which waitress reads as its path), with its extra headers, None for a
    path: ``OPTIONS *`` (asterisk-form, the server as a whole) 200 with ``Allow`` (:data:`SERVER_METHODS`);
    ``CONNECT`` (authority-form ``host:port``, a tunnel through a proxy) 405; another method with ``*``, a
    ``host:port`` or any other target that is not a path, 400. Each message names the target as it was sent
    (until 2026-12-07 ``CONNECT x:80`` was read as the path ``80``: a 405 that said ``80 (the Prometheus scrape)
    answers GET and HEAD, not CONNECT``)."""
    if target is None:  # (not waitress: nothing to check)
        return None
    shown = repr(target[:200])
    if method == "CONNECT":
        return (ProbeAnswer(405, f"CONNECT {shown} is not served: CONNECT asks for a tunnel through a proxy (RFC 9110 "
                                 f"9.3.6), and this server is not one; it answers {SERVER_METHODS} on its paths"),
                (("Allow", SERVER_METHODS),))
    if target.startswith("/") or _ABSOLUTE_FORM.match(target):
        return None
    if target == "*":
        if method == "OPTIONS":
            return ProbeAnswer(200), (("Allow", SERVER_METHODS),)
        return (ProbeAnswer(400, f"the request-target '*' is for OPTIONS alone (RFC 9112 3.2.4), not {method}; send "
                                 "a path (/v2/..., /metrics)"), ())
    return (ProbeAnswer(400, f"the request-target {shown} is not a path: send an origin-form target such as "
                             "/v2/health/ready (RFC 9112 3.2)"), ())


REPOSITORY_WORDS = "the node's model repository (--models)"
"""What an HTTP error message says where an ingress's message named the model repository's absolute path."""


def _without_paths(answer, gateway):
    """``answer`` with the node's model repository's absolute path left out of its error message (the HTTP port has
    no authentication: a message such as ``no model folder 'x' with a config.json under /srv/models`` told any caller
    the server's file layout): a path under it is named relative to it (``x/config.json``), the folder itself
    :data:`REPOSITORY_WORDS`. The message as it came is logged (debug). A 2xx answer, or one without a JSON
    ``{"error": ...}`` body, is returned as it is."""
    import json
    import os

    from ._gateway import HttpAnswer

    if gateway is None or not isinstance(answer, HttpAnswer) or answer.status < 400:
        return answer
    models_dir = getattr(getattr(gateway.node, "config", None), "models_dir", None)
    if not models_dir:
        return answer
    roots = {os.path.abspath(models_dir), os.path.realpath(models_dir)}
    text = answer.body.decode("utf-8", "replace")
    if not any(r in text or json.dumps(r)[1:-1] in text for r in roots):
        return answer
    try:
        doc = json.loads(answer.body)
    except ValueError:
        return answer
    message = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(message, str):
        return answer
    told = message
    for root in sorted(roots, key=len, reverse=True):
        told = told.replace(root.rstrip(os.sep) + os.sep, "").replace(root, REPOSITORY_WORDS)
    _log.debug("HTTP %d answered with the model repository's path left out: %s", answer.status, message)
    return HttpAnswer(answer.status, json.dumps({**doc, "error": told}).encode(), answer.headers)


def node_app(metrics_app, probes: NodeProbes, gateway=None):
    """The node's WSGI app (PEP 3333): the OIP v2 health paths of ``probes`` under ``/v2/``, with ``gateway`` (a
    :class:`~inferbus.actors._gateway.NodeGateway`) the OIP v2 REST metadata and inference paths too, and Triton's
    statistics and model repository extensions (:mod:`inferbus.actors._httpext`), and
    ``metrics_app`` (prometheus-client's) on every other path for ``GET``, as before.

    ``HEAD`` answers what ``GET`` does, without a body (``/metrics``'s with the length its body has); ``OPTIONS``
    answers 200 with ``Allow`` (on a ``/v2`` path, the methods that path answers), unless the path names a model or
    version that cannot be one (400) or does not exist (404): then what ``GET`` answers (a ``POST`` path: the model
    metadata's, or a repository write's; :func:`_route`), so ``OPTIONS`` asks the ingress or the node's actors as
    ``HEAD`` does (until 2026-12-07 it answered 200 from the path's shape alone); any other method a path does not
    answer is 405 with ``Allow`` as ``OPTIONS`` gives it (``OPTIONS, GET, HEAD`` for the health, metadata and
    statistics paths, ``OPTIONS, POST`` for ``infer`` and the ``/v2/repository/`` paths, ``OPTIONS, GET, HEAD``
    outside ``/v2/``). An unknown path under ``/v2/`` is 404 naming the paths there are. Every error answer, the
    405 of a path outside ``/v2/`` included (text until 2026-12-07), is the API's JSON ``{"error": "<why>"}`` with
    ``Inferbus-Error-Code`` (:func:`~inferbus.actors._gateway.error_answer`).
    Paths are read as UTF-8 after percent-decoding; one that is not UTF-8 then is 400.
    """
    import time

    def app(environ, start_response):
        started_at = time.monotonic()
        method = environ.get("REQUEST_METHOD", "GET")
        refused = _target_refusal(method, environ.get("REQUEST_URI"))
        if refused is not None:
            return _answer(start_response, method, refused[0], refused[1])
        raw = environ.get("PATH_INFO", "") or "/"
        try:
            path = raw.encode("latin-1", "replace").decode("utf-8")  # PEP 3333: the bytes as latin-1
        except UnicodeDecodeError as exc:
            # (read with replacement characters until 2026-12-07: /v2/models/%FF was "unknown model '\ufffd'", 404)
            return _answer(start_response, method, ProbeAnswer(
                400, f"the path is not UTF-8 after percent-decoding (byte {exc.object[exc.start]:#04x} at "
                     f"{exc.start}): send a model name or version as UTF-8, percent-encoded"))
        if path == "/v2" or path.startswith("/v2/"):
            route = _route(path, probes, gateway)
            if route is None:
                paths = _GATEWAY_PATHS if gateway is not None else _PROBE_PATHS
                return _answer(start_response, method, ProbeAnswer(404, f"no such path: {path} (the paths under "
                                                                        f"/v2: {paths}; metrics: /metrics)"))
            methods, handler, check = route
            allow = ", ".join(methods)
            if method == "OPTIONS":
                if check is not None:  # a model or version that cannot be one or does not exist: as GET answers it
                    answer = check(environ, started_at)
                    if answer.status in (400, 404):
                        return _answer(start_response, method, answer)
                start_response("200 OK", [("Allow", f"OPTIONS, {allow}"), ("Content-Length", "0")])
                return []
            if method not in methods:
                return _answer(start_response, method, ProbeAnswer(405, f"{path} answers {' and '.join(methods)}, "
                                                                        f"not {method}"), (("Allow", f"OPTIONS, {allow}"),))
            return _answer(start_response, method, _without_paths(handler(environ, started_at), gateway))
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS, GET, HEAD"), ("Content-Length", "0")])
            return []
        if method == "HEAD":
            got: list = []

            def capture(status, headers, exc_info=None):
                got[:] = [status, headers]
                return lambda data: None

            body = b"".join(metrics_app({**environ, "REQUEST_METHOD": "GET"}, capture))
            status, headers = got
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            start_response(status, [*headers, ("Content-Length", str(len(body)))])
            return []
        if method != "GET":  # (JSON with the code, as every other error answer of the port)
            return _answer(start_response, method, ProbeAnswer(405, f"{path} (the Prometheus scrape) answers GET "
                                                                    f"and HEAD, not {method}"),
                           (("Allow", "OPTIONS, GET, HEAD"),))
        return metrics_app(environ, start_response)

    return app
