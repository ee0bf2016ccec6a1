"""Subject names (DESIGN §3). One place builds every subject from the prefix.

Public:   ``<p>.infer.<model>[.<version>]`` (queue group ``<p>.ingress``),
          ``<p>.models``, ``<p>.models.<model>[.<version>][.ready]``, ``<p>.health``, ``<p>.server``;
          ``<p>.ingresses`` (every ingress answers its id) and ``<p>.ingresses.<ingress_id>.<...>`` for ``infer.<...>``,
          ``health``, ``server``, ``models`` and ``models.<...>`` (the same requests at that one ingress): where a
          client sends a retry (docs/wire.md, "Retries at one ingress");
          ``<p>.nodes`` (every node answers its supervision tree: ``inferbus nodes``).
Internal: ``<p>._w.<worker_id>``   worker-direct (requests forwarded by an ingress);
          ``<p>._load``            worker load/health reports (every ``report_interval_ms``);
          ``<p>._done.<ingress>``  completion notices from workers to one ingress;
          ``<p>._cache.fill``      cache fills for the aggregator (queue group);
          ``<p>._events``          process lifecycle events from the node supervisor;
          ``<p>._deaths``          ingresses share their query-of-death memory (``.get``: one starting asks);
          ``<p>._region.hb.<r>``   region manager heartbeats (fencing term);
          ``<p>._region.ctl.<r>``  operator requests to a region manager;
          ``<p>._models.state``    model serving states (model-management writes, every actor listens);
          ``<p>._models.get``      an actor starting up asks the ingresses and workers for the current states.
Model management (public): ``<p>.models.<model>.load``, ``.unload``, ``.default`` (queue group of the
ingress actors, served by the ``models.>`` endpoint; see docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CONTROL_LINE_BYTES = 4096
"""The longest protocol line a NATS server takes from a client, bytes: nats-server's ``max_control_line``, whose
default (4096) inferbus assumes (the server does not tell it in its INFO; a server configured lower than that is
not supported). A ``PUB``/``HPUB`` line holds the subject and the reply subject; a longer one is answered
``-ERR 'maximum control line exceeded'`` and the connection is closed, and nats-py does not reconnect after such an
error: the connection is gone for good. So every subject inferbus builds from a caller's input is bounded: a model
name (:data:`MAX_NAME_BYTES`), a version (:data:`MAX_VERSION`), a prefix (:data:`MAX_PREFIX_BYTES`), a reply subject
an ingress forwards (:data:`MAX_REPLY_BYTES`); and the SDK checks each request's line before sending it
(:func:`control_line_problem`). A fresh-user trial: one HTTP request naming a model of 4,100 characters closed the
node's own connection, and the node answered 503 to every ``/v2`` path afterwards."""

LINE_OVERHEAD_BYTES = 32
"""The most a ``HPUB <subject> <reply> <header bytes> <total bytes>\\r\\n`` line holds besides its two subjects,
bytes: the verb and four spaces (9), two sizes of up to 10 digits (20), CRLF (2)."""

MAX_NAME_BYTES = 128
"""The longest model name, in bytes of UTF-8 (128 ASCII characters): a model folder with a longer name is refused
when the repository is read, and the SDK, the HTTP gateway, the CLI and the ingresses refuse a longer name
(INVALID_ARGUMENT, field ``model``) before anything is sent. Also the longest ingress id the SDK sends to. With
:data:`MAX_PREFIX_BYTES` and :data:`MAX_VERSION` the longest subject inferbus sends a request on
(:data:`LONGEST_SUBJECT_BYTES`) stays far below :data:`MAX_CONTROL_LINE_BYTES`."""

MAX_PREFIX_BYTES = 128
"""The longest subject prefix (``--prefix``, :class:`~inferbus.bus.BusConfig`), bytes (a prefix is ASCII)."""

MAX_VERSION = 2**63 - 1
"""The largest version number: versions are 64-bit integers, as Triton's are. A version folder over it is refused
when the repository is read; a larger number (or one of more than 19 digits) names no version
(INVALID_ARGUMENT, :func:`version_problem`)."""

MAX_REPLY_BYTES = 1024
"""The longest reply subject an ingress takes with an inference request, bytes: it forwards the request to a worker
with that reply subject (``HPUB <p>._w.<worker> <reply> ...``), a line longer than the client's own; a longer one is
refused INVALID_ARGUMENT (field ``reply``). nats-py's inboxes are 56 bytes (``_INBOX.<22>.<26>``)."""

LONGEST_SUBJECT_BYTES = (MAX_PREFIX_BYTES + len(".ingresses.") + MAX_NAME_BYTES + len(".models.") + MAX_NAME_BYTES
                         + len(".") + len(str(MAX_VERSION)) + len(".unload"))
"""The longest subject inferbus sends a request on from a caller's names (430 bytes):
``<p>.ingresses.<ingress>.models.<model>.<version>.ready`` or ``<p>.ingresses.<ingress>.models.<model>.unload``."""


def name_problem(value: str, field: str = "model") -> str | None:
    """The INVALID_ARGUMENT message (field ``field``) for a name that is longer than :data:`MAX_NAME_BYTES` bytes of
    UTF-8, else None. The name is shown cut to 40 characters (it may be thousands)."""
    if len(value) * 4 <= MAX_NAME_BYTES:  # (UTF-8 takes at most 4 bytes a character: no need to count)
        return None
    n = len(value.encode("utf-8", "surrogatepass"))
    if n <= MAX_NAME_BYTES:
        return None
    shown = repr(value[:40]) + (f" (cut; {len(value)} characters)" if len(value) > 40 else "")
    return (f"{field} {shown} is {n} bytes of UTF-8; a name is at most {MAX_NAME_BYTES} bytes (it goes into NATS "
            f"subjects, whose length the server bounds)")


def reply_bytes(nc) -> int:
    """The length of the reply subject nats-py gives a request on ``nc``, bytes: its inbox prefix (``_INBOX`` unless
    ``inbox_prefix`` was given to ``nats.connect``), a dot, a NUID (22), a dot, a token (26): 56 by default."""
    return len(getattr(nc, "_inbox_prefix", None) or b"_INBOX") + 50


def control_line_problem(subject: str, reply: int = 0) -> str | None:
    """Why a message on ``subject`` with a reply subject of ``reply`` bytes cannot be sent, else None: its
    ``HPUB`` line would be longer than :data:`MAX_CONTROL_LINE_BYTES` (the server would close the connection)."""
    if (len(subject) + reply) * 4 + LINE_OVERHEAD_BYTES <= MAX_CONTROL_LINE_BYTES:  # (no need to count bytes)
        return None
    n = len(subject.encode("utf-8", "surrogatepass")) + reply + LINE_OVERHEAD_BYTES
    if n <= MAX_CONTROL_LINE_BYTES:
        return None
    shown = repr(subject[:60]) + (f" (cut; {len(subject)} characters)" if len(subject) > 60 else "")
    return (f"subject {shown} is too long: its protocol line would be {n} bytes, over the NATS server's "
            f"max_control_line ({MAX_CONTROL_LINE_BYTES} bytes), and the server would close the connection")


def leading_zero_fix(version: str) -> str | None:
    """How ``version`` is written when it is a string of digits with a leading zero (``"01"`` → ``"1"``), else None.

    A version is an integer named by one folder without leading zeros (docs/models.md), so ``01`` names no version
    a subject can carry: the repository refuses such a folder, and the SDK, the ingress and a model-management
    write refuse such a version as INVALID_ARGUMENT (:func:`version_problem`)."""
    if len(version) > 1 and version[0] == "0" and version.isascii() and version.isdigit():
        return version.lstrip("0") or "0"  # (not int(): Python refuses to read more than 4,300 digits)
    return None


def version_problem(version: str | None) -> str | None:
    """The INVALID_ARGUMENT message (field ``model_version``) for a ``version`` no version folder can be named: not
    ASCII decimal digits (``+1``, ``١``, ``v1``, or not a string at all), a leading zero
    (:func:`leading_zero_problem`), or a number over :data:`MAX_VERSION` (it was NOT_FOUND, and a version of
    thousands of digits made a subject the NATS server refused); else None (also for None: no version named). An
    ingress answered such versions NOT_FOUND ("has no version") where the SDK says INVALID_ARGUMENT (a fresh-user
    trial)."""
    if version is None:
        return None
    if not (isinstance(version, str) and version.isascii() and version.isdigit()):
        shown = repr(version[:40]) + "..." if isinstance(version, str) and len(version) > 40 else repr(version)
        return (f"version {shown} is not a number: versions are named by their folders' decimal numbers "
                f"(e.g. '1')")
    if (problem := leading_zero_problem(version)) is not None:
        return problem
    if len(version) > 19 or int(version) > MAX_VERSION:  # (19 digits: int() of thousands of digits is refused)
        shown = repr(version[:40]) + (f" (cut; {len(version)} digits)" if len(version) > 40 else "")
        return (f"version {shown} is over the largest version, {MAX_VERSION}: versions are 64-bit integers, as "
                f"Triton's are")
    return None


def leading_zero_problem(version: str | None) -> str | None:
    """The INVALID_ARGUMENT message (field ``model_version``) for a ``version`` with a leading zero (see
    :func:`leading_zero_fix`), else None: the second half of :func:`version_problem`, which the SDK, an ingress's
    inference and metadata subjects and the ``models`` writes use."""
    fix = leading_zero_fix(version) if isinstance(version, str) else None
    if fix is None:
        return None
    if len(version) > 40:  # (a version of thousands of digits: not all of them twice in the message)
        return (f"version {version[:40]!r}... ({len(version)} digits) has leading zeros: write it without them "
                f"(version folders are numbers without leading zeros)")
    return f"version {version!r} has a leading zero: write it {fix!r} (version folders are numbers without leading zeros)"


@dataclass(frozen=True)
class Subjects:
    """Builds subjects under one prefix (default ``inferbus``)."""

    prefix: str = "inferbus"

    @property
    def infer_all(self) -> str:
        return f"{self.prefix}.infer.>"

    @property
    def infer_bare(self) -> str:
        """``<p>.infer`` with no model token: answered INVALID_ARGUMENT by the ingresses."""
        return f"{self.prefix}.infer"

    def infer(self, model: str, version: str | None = None) -> str:
        return f"{self.prefix}.infer.{model}" + (f".{version}" if version else "")

    @property
    def nodes(self) -> str:
        """``<p>.nodes``: every node (``inferbus up``) answers its supervision tree as JSON (no queue group;
        ``inferbus nodes``)."""
        return f"{self.prefix}.nodes"

    @property
    def ingresses(self) -> str:
        """``<p>.ingresses``: every ingress that serves answers with its id (UTF-8, no queue group), so the first
        answer names a live ingress that is keeping up (the SDK sends a retry there after an attempt timed out)."""
        return f"{self.prefix}.ingresses"

    def ingress_infer(self, ingress_id: str) -> str:
        """``<p>.ingresses.<ingress_id>.infer``: the prefix of the inference subjects of one ingress; a request on
        ``<this>.<model>[.<version>]`` is served as on ``<p>.infer.<model>[.<version>]``, by that ingress only."""
        return f"{self.prefix}.ingresses.{ingress_id}.infer"

    def at_ingress(self, subject: str, ingress_id: str) -> str | None:
        """The subject of a request on ``subject`` sent to ingress ``ingress_id`` only: ``<p>.ingresses.<id>.<rest>``
        for ``<p>.<rest>`` an inference subject (``infer.<model>[.<version>]``), ``health``, ``server``, ``models`` or
        ``models.<...>`` (metadata, readiness, model-management writes); None for another subject."""
        head = f"{self.prefix}."
        if not subject.startswith(head):
            return None
        rest = subject[len(head):]
        if rest.startswith(("infer.", "models.")) or rest in ("health", "server", "models"):
            return f"{self.prefix}.ingresses.{ingress_id}.{rest}"
        return None

    def ingress_of(self, subject: str) -> str | None:
        """The ingress id of a subject :meth:`at_ingress` built (``<p>.ingresses.<id>.<rest>`` → ``id``); None for a
        subject of no one ingress."""
        head = f"{self.prefix}.ingresses."
        if not subject.startswith(head):
            return None
        ingress_id, dot, _ = subject[len(head):].partition(".")
        return ingress_id if dot and ingress_id else None

    def parse_infer(self, subject: str) -> tuple[str, str | None]:
        """``<p>.infer.digits.2`` → ``("digits", "2")``; extra tokens are kept in the version."""
        rest = subject[len(self.prefix) + 7 :]
        model, _, version = rest.partition(".")
        return model, (version or None)

    @property
    def models(self) -> str:
        return f"{self.prefix}.models"

    def model(self, name: str) -> str:
        return f"{self.prefix}.models.{name}"

    @property
    def models_all(self) -> str:
        return f"{self.prefix}.models.>"

    def model_control(self, name: str, op: str) -> str:
        """``<p>.models.<name>.<op>``, op ``load``, ``unload`` or ``default`` (model-management writes)."""
        return f"{self.prefix}.models.{name}.{op}"

    @property
    def model_state(self) -> str:
        """Model serving states (``ModelStates``), broadcast by the ingresses."""
        return f"{self.prefix}._models.state"

    @property
    def model_state_get(self) -> str:
        """Request the current model serving states from any ingress (answered with ``ModelStates``)."""
        return f"{self.prefix}._models.get"

    @property
    def health(self) -> str:
        return f"{self.prefix}.health"

    @property
    def server(self) -> str:
        """OIP v2 server metadata (``ServerMetadata``)."""
        return f"{self.prefix}.server"

    def model_ready(self, name: str, version: str | None = None) -> str:
        """``<p>.models.<name>[.<version>].ready``: OIP v2 model ready (``ModelReady``)."""
        return f"{self.prefix}.models.{name}.{version}.ready" if version else f"{self.prefix}.models.{name}.ready"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}._w.{worker_id}"

    @property
    def load(self) -> str:
        return f"{self.prefix}._load"

    def done(self, ingress_id: str) -> str:
        return f"{self.prefix}._done.{ingress_id}"

    @property
    def rid_query(self) -> str:
        """Ingress peers: ``"<model_key> <request_id>"`` → the id of the worker holding a pending copy (every
        ingress subscribes, no queue group; only one holding the copy answers)."""
        return f"{self.prefix}._rid"

    @property
    def deaths(self) -> str:
        """Ingress peers: what each learned of a crash (``DeathMemory``, the entries it changed; every ingress
        subscribes, no queue group)."""
        return f"{self.prefix}._deaths"

    @property
    def deaths_get(self) -> str:
        """An ingress starting asks its peers for their query-of-death memory (``DeathMemory`` replies, from each
        peer that remembers something)."""
        return f"{self.prefix}._deaths.get"

    @property
    def cache_fill(self) -> str:
        return f"{self.prefix}._cache.fill"

    @property
    def audit(self) -> str:
        """Executed request ids (msgpack list of str) from workers started with ``audit=True`` (drills)."""
        return f"{self.prefix}._audit"

    @property
    def events(self) -> str:
        return f"{self.prefix}._events"

    def region_heartbeat(self, region: str) -> str:
        """Heartbeats of one region's manager (``RegionHeartbeat``, every ``heartbeat_ms``)."""
        return f"{self.prefix}._region.hb.{region}"

    @property
    def region_heartbeats(self) -> str:
        """Every region manager's heartbeats; ingresses and workers learn the fencing term here."""
        return f"{self.prefix}._region.hb.*"

    def region_control(self, region: str) -> str:
        """Operator requests to one region manager (``RegionCommand`` → ``RegionReply``)."""
        return f"{self.prefix}._region.ctl.{region}"

    @property
    def ingress_queue(self) -> str:
        return f"{self.prefix}.ingress"
