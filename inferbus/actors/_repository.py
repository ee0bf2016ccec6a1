"""The model repository: a folder laid out like Triton's.

::

    models/
      <name>/config.json        {"name", "platform", "max_batch_size", "cache_ttl_ms", "default_version", ...}
      <name>/<version>/model.onnx
      <name>/data/test.npz      optional reference rows: the worker's precision check, ``inferbus bench``

Versions are the numeric sub-folders holding ``model.onnx``, named as Triton names them: the
version number in decimal without leading zeros (``1``, ``10``; a folder ``01`` is refused, as it
would be a second name for version 1); the default version is ``config.default_version`` or the
highest number (numeric order: 10 > 9). Metadata (tensor names, datatypes, shapes) is read from the
artifact with ONNX Runtime.

``data/test.npz`` is checked from its arrays' headers (nothing is unpickled, no data is read): it
must be a ``.npz`` (a zip of ``.npy`` arrays) without object arrays, holding for a model with one
input an array named after the input or ``X``, and for a model with several inputs one array per
input name; each such array has the input's rank, at least one row along the first axis (the
batch axis, which must be dynamic), the input's size in every fixed dimension, and a numeric dtype
(bool, int, uint, float: cast to the input's). A model with a BYTES input or output can have none
(the precision check compares numbers). Other arrays (``y``) are not read. What passes is what
:func:`inferbus.accelerators._precision.load_reference` and ``load_checked`` (the worker) and
:class:`inferbus.loadgen.Workload` (the load generator) read; a damaged array body (bad CRC) is
not seen here, and fails the worker's load (:class:`ModelStartError`).

``config.json`` is one JSON object, checked when the folder is read (:class:`ModelConfig`);
a malformed one is a :class:`ModelConfigError` naming the file, the model and the field:

=====================  ===========================================================  ==================
key                    allowed                                                      absent
=====================  ===========================================================  ==================
``name``               the folder's name (a subject token of <= 128 bytes)          the folder's name
``platform``           a non-empty string but ``"ensemble"`` (in the metadata)      ``onnxruntime_onnx``
``max_batch_size``     an integer 0 to :data:`MAX_BATCH_SIZE` (0 = no batching)     0
``cache_ttl_ms``       an integer 0 to :data:`MAX_CACHE_TTL_MS` (0 = no caching)    100
``default_version``    a version on disk, as an integer or a string of digits       the highest version
``description``        a string                                                     ``""``
``hedge_after_ms``     null, ``"off"``, a number of ms > 0, ``"pNN"`` or ``"auto"``  no hedging
``version_policy``     Triton's: ``{"all": {}}``, ``{"latest": {"num_versions": N}}``  every version
                       or ``{"specific": {"versions": [1, 3]}}``
=====================  ===========================================================  ==================

``version_policy`` chooses the versions served at start and by a ``load`` that names no version (as Triton's does;
Triton's default, when the key is absent, is the latest version only: inferbus's is every version on disk). A
``load`` that names a version loads it whatever the policy.

Other keys (Triton's ``input``/``output`` lists, ``dynamic_batching``, ``instance_group``, ...) are kept in
``ModelConfig.extra`` unread, except those asking for what inferbus cannot honour, which are refused as a malformed
value is (:func:`_triton_unsupported`): ``platform: "ensemble"`` or ``ensemble_scheduling`` (an ensemble),
``sequence_batching``, ``backend: "python"``, ``model_transaction_policy.decoupled: true`` and a
``default_model_filename`` other than ``model.onnx`` (docs/models.md lists which of Triton's keys are read,
refused and not read).
"""

from __future__ import annotations

import functools
import json
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._limits import interval
from ..accelerators import OnnxRuntimeBackend, TensorInfo
from ..bus import leading_zero_fix, version_problem
from ..bus._subjects import MAX_VERSION, name_problem
from ._hedge import HedgePolicyError, parse_policy

MAX_BATCH_SIZE = 65_536
"""Largest ``max_batch_size`` a model's config may give: each worker warms the model up at every power of two
up to it (a typo such as ``64000000000`` would allocate that many rows and kill the worker at start)."""
MAX_CACHE_TTL_MS = 86_400_000
"""Longest ``cache_ttl_ms`` a model's config may give: one day (the value travels as an integer in the
ingresses' cache-fill messages, which a 20-digit one would not fit)."""


class RepositoryError(ValueError):
    """The model repository cannot be served (missing config, bad JSON, no versions, unreadable artifact).

    ::

        RepositoryError                 no folder, no config.json, no versions
        ├── ModelConfigError            a malformed config.json
        ├── ModelArtifactError          a file or folder of a model cannot be served
        │   ├── ModelVersionsError      version folders that name one version twice (1 and 01)
        │   └── ModelDataError          a data/test.npz that cannot serve as reference rows
        ├── ModelStartError             a worker could not load a version the checks passed (the runtime's reason)
        └── ModelPinError               a served version's files are not those it was pinned to (changed, missing)

    Model management (``inferbus models load``) answers INVALID_ARGUMENT for a ModelConfigError or a
    ModelArtifactError, NOT_FOUND for the others.
    """


class ModelArtifactError(RepositoryError):
    """A model version's ``model.onnx`` is there but cannot be read as a model (the message names the file and
    the runtime's reason); the subclasses, another file or folder of the model that cannot be served."""


# MAX_VERSION: the largest version folder a model may have (Triton's versions are int64; 19 digits), defined with the
# subjects (inferbus.bus._subjects): a request naming a larger one is INVALID_ARGUMENT


class ModelVersionsError(ModelArtifactError):
    """Version folders holding a ``model.onnx`` whose names are not the canonical decimal of their version
    (``01``, ``007``): the message names them and the folder of the same version, if any."""


class ModelDataError(ModelArtifactError):
    """A model's ``data/test.npz`` cannot serve as its reference rows (the message names the file and says
    why: not an npz, pickled objects, an array that does not fit an input)."""


class ModelConfigError(RepositoryError):
    """A model's ``config.json`` is not a JSON object of the allowed keys and values (the message names the
    file, the model and the field)."""


class ModelStartError(RepositoryError):
    """A worker could not load a model version that the repository's checks passed (the message names the
    model, the version and the runtime's reason). An actor process that cannot start for a RepositoryError
    prints one line starting with :data:`UNSERVABLE_PREFIX` and exits 2 (``inferbus/actors/__main__.py``)."""


class ModelPinError(RepositoryError):
    """A model version's files are not those it was pinned to when first loaded (:mod:`._pinning`): changed
    (``digest mismatch: expected X got Y``), missing (``files missing``), or changed while being loaded. The message
    names the model, the version, the folder and what to do; the worker that raised it does not serve the version."""


UNSERVABLE_PREFIX = "inferbus: the model repository cannot be served: "
"""First words of the one line an actor process prints when it exits for a :class:`RepositoryError` at start;
``inferbus up`` finds it in the output of a child that did not start and prints its reason."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token(value: str) -> bool:
    """``value`` can be one NATS subject token (the model name is one in ``<p>.infer.<model>[.<version>]``)."""
    return bool(value) and value.isprintable() and not any(c.isspace() or c in ".*>" for c in value)


@dataclass(frozen=True)
class ModelVersion:
    """One loadable version: the artifact and its tensors."""

    name: str
    version: str
    path: Path
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    @functools.cached_property
    def key(self) -> str:
        """``name:version``, the routing key of this model version (built once: read several times a request)."""
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class ModelConfig:
    """A model's ``config.json``, checked on construction.

    Raises:
        ValueError: a field of the wrong type or out of its range (the message names the field and the
            allowed form), or a Triton feature inferbus does not have (:func:`_triton_unsupported`).
            :meth:`ModelRepository._scan` turns it into a :class:`ModelConfigError` naming
            the file and the model.
    """

    name: str
    """The model's name: one NATS subject token (no ``.``, ``*``, ``>`` or whitespace) of at most
    :data:`~inferbus.bus._subjects.MAX_NAME_BYTES` (128) bytes of UTF-8."""
    platform: str = "onnxruntime_onnx"
    max_batch_size: int = 0
    """Largest batch the worker may form from queued requests (0 = no batching), 0 to :data:`MAX_BATCH_SIZE`."""
    cache_ttl_ms: int = 100
    """Result cache TTL in ms; 0 disables caching for the model. 0 to :data:`MAX_CACHE_TTL_MS`."""
    default_version: str | None = None
    """The version serving requests that name none (a string of digits or an integer, kept as its canonical
    decimal string: ``"01"`` and ``1`` are ``"1"``); None = the highest version on disk."""
    description: str = ""
    hedge_after_ms: float | str | None = None
    """Hedge policy (:func:`~inferbus.actors._hedge.parse_policy`): None/``"off"``, ms > 0, ``"pNN"``, ``"auto"``."""
    version_policy: dict | None = None
    """Triton's ``version_policy``, checked and canonical (:func:`check_version_policy`); None = every version."""
    extra: dict = field(default_factory=dict)
    """The other keys of ``config.json``, unread."""

    def __post_init__(self) -> None:
        if isinstance(self.name, str) and (problem := name_problem(self.name, "name")) is not None:
            # a request could not name it: the SDK, the HTTP gateway and the CLI refuse a longer name before sending
            raise ValueError(f"{problem}: rename the folder")
        if not isinstance(self.name, str) or not _is_token(self.name):
            raise ValueError(f"name must be a non-empty string without '.', '*', '>' or whitespace (one NATS "
                             f"subject token), got {self.name!r}")
        why = _triton_unsupported(self.platform, self.extra)
        if why is not None:
            raise ValueError(why)
        if not isinstance(self.platform, str) or not self.platform:
            raise ValueError(f"platform must be a non-empty string (e.g. \"onnxruntime_onnx\"), got {self.platform!r}")
        if not _is_int(self.max_batch_size) or not 0 <= self.max_batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"max_batch_size must be an integer in {interval(0, MAX_BATCH_SIZE)} (0 = no batching), "
                             f"got {self.max_batch_size!r}")
        if not _is_int(self.cache_ttl_ms) or not 0 <= self.cache_ttl_ms <= MAX_CACHE_TTL_MS:
            raise ValueError(f"cache_ttl_ms must be an integer in {interval(0, MAX_CACHE_TTL_MS)} ms (0 = no caching), "
                             f"got {self.cache_ttl_ms!r}")
        v = self.default_version
        if _is_int(v) and v >= 0:
            object.__setattr__(self, "default_version", str(v))
        elif v is not None and not (isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 20):
            raise ValueError(f"default_version must be a version number (an integer or a string of digits, the "
                             f"name of a version folder) or null, got {v!r}")
        elif v is not None:  # "01" is version 1, as the integer 1 is (version folders have no leading zeros)
            object.__setattr__(self, "default_version", str(int(v)))
        if not isinstance(self.description, str):
            raise ValueError(f"description must be a string, got {self.description!r}")
        if not (self.hedge_after_ms is None or isinstance(self.hedge_after_ms, (str, int, float))):
            raise ValueError(f"hedge_after_ms must be a number of ms > 0, 'off', 'pNN' (e.g. 'p95') or 'auto', "
                             f"got {self.hedge_after_ms!r}")
        try:
            parse_policy(self.hedge_after_ms)
        except HedgePolicyError as exc:
            raise ValueError(f"hedge_after_ms: {exc}") from None
        object.__setattr__(self, "version_policy", check_version_policy(self.version_policy))


_POLICY_FORMS = ('{"all": {}}, {"latest": {"num_versions": N}} (N >= 1) or {"specific": {"versions": [1, 3]}} '
                 "(Triton's version_policy)")


def _as_json(value) -> str:
    """A value of ``config.json`` as its JSON (``{"num_versions": -1}``), as a refusal quotes it: Python's repr of
    it (``{'num_versions': -1}``) is no JSON."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):  # (not from a JSON file: a config made in Python)
        return repr(value)


def check_version_policy(policy) -> dict | None:
    """``policy`` (``config.json``'s ``version_policy``, Triton's ``ModelVersionPolicy`` in JSON) in its canonical
    form: None (absent or null), ``{"all": {}}``, ``{"latest": {"num_versions": N}}`` or ``{"specific": {"versions":
    ["1", "3"]}}`` (version names; Triton's JSON gives int64s as numbers or strings of digits).

    Raises:
        ValueError: not one of those forms (naming the part that is not).
    """
    if policy is None:
        return None
    if not (isinstance(policy, dict) and len(policy) == 1 and next(iter(policy)) in ("all", "latest", "specific")):
        raise ValueError(f"version_policy must be one of {_POLICY_FORMS}, got {_as_json(policy)}")
    (kind, body), = policy.items()
    if not isinstance(body, dict):
        raise ValueError(f"version_policy.{kind} must be an object, got {_as_json(body)}")
    if kind == "all":
        if body:
            raise ValueError(f"version_policy.all takes no keys ({{\"all\": {{}}}}), got {_as_json(body)}")
        return {"all": {}}
    if kind == "latest":
        n = body.get("num_versions")
        if set(body) != {"num_versions"} or not (_is_int(n) and n >= 1):
            raise ValueError(f"version_policy.latest must be {{\"num_versions\": N}} with an integer N >= 1, "
                             f"got {_as_json(body)}")
        return {"latest": {"num_versions": n}}
    versions = body.get("versions")
    names = []
    for v in versions if set(body) == {"versions"} and isinstance(versions, list) and versions else [None]:
        if _is_int(v) and v >= 0:
            v = str(v)
        fix = leading_zero_fix(v) if isinstance(v, str) else None
        if fix is not None:  # as a folder or a request may not name a version so (a trial: "01" served version 1)
            raise ValueError(f"version_policy.specific.versions: {v!r} has a leading zero: write {fix!r}")
        if v is None or version_problem(v) is not None or len(v) >= 20:
            raise ValueError(f"version_policy.specific must be {{\"versions\": [...]}}, a non-empty list of version "
                             f"numbers, got {_as_json(body)}")
        names.append(v)
    return {"specific": {"versions": sorted(set(names), key=int)}}


def policy_versions(policy: dict | None, on_disk) -> set[str] | None:
    """The version names of ``on_disk`` that ``policy`` (canonical, :func:`check_version_policy`) serves; None =
    all of them. A ``specific`` version with no folder is not served (the caller says so)."""
    if policy is None or "all" in policy:
        return None
    if "latest" in policy:
        return set(sorted(on_disk, key=int)[-policy["latest"]["num_versions"]:])
    return set(policy["specific"]["versions"]) & set(on_disk)


def _triton_unsupported(platform, extra: dict) -> str | None:
    """Why a ``config.json`` of ``platform`` and other keys ``extra`` asks for a Triton feature inferbus does not
    have, where serving ``<version>/model.onnx`` alone would answer other than Triton does (an ensemble, a stateful
    sequence model, a Python-backend model, a decoupled model, another model file); None when it does not."""
    def folded(v):  # "ENSEMBLE", " Python": Triton refuses them as unknown; served here they would be read as meant
        return v.strip().lower() if isinstance(v, str) else v

    found = [k for k, given in (("platform \"ensemble\"", folded(platform) == "ensemble"),
                                ("ensemble_scheduling", extra.get("ensemble_scheduling") is not None)) if given]
    if found:
        return (f"{' and '.join(found)}: Triton ensembles are not supported: inferbus serves each model's "
                f"<version>/model.onnx on its own; serve the steps as models of their own and call them in turn, or "
                f"export the pipeline as one ONNX model")
    if extra.get("sequence_batching") is not None:
        return ("sequence_batching is not supported: Triton's sequence batcher serves stateful models (the requests "
                "of a sequence carry a correlation ID and control inputs, and state is kept between them on one "
                "instance), while inferbus answers each request on its own, on any worker, and caches answers by their "
                "inputs; serve a stateless model")
    if folded(extra.get("backend")) == "python":
        return ("backend \"python\" is not supported: a Triton Python-backend model is the code of its model.py, "
                "which inferbus does not run (it would serve <version>/model.onnx alone, without that code); export "
                "the whole model to ONNX")
    policy = extra.get("model_transaction_policy")
    decoupled = folded(policy.get("decoupled")) if isinstance(policy, dict) else None
    if decoupled is True or decoupled == "true":  # (the string asks for it as plainly)
        return ("model_transaction_policy.decoupled is not supported: a Triton decoupled model sends zero or more "
                "responses a request, while inferbus answers each request once")
    if decoupled not in (None, False, "false"):
        return f"model_transaction_policy.decoupled must be false (or left out), got {policy.get('decoupled')!r}"
    filename = extra.get("default_model_filename")
    if filename is not None and filename != "model.onnx":
        return (f"default_model_filename {filename!r} is not supported: inferbus reads <version>/model.onnx only; "
                f"name the file model.onnx and leave the key out")
    return None


@dataclass(frozen=True)
class Model:
    config: ModelConfig
    versions: dict[str, ModelVersion]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def default_version(self) -> str:
        if self.config.default_version is not None and str(self.config.default_version) in self.versions:
            return str(self.config.default_version)
        return max(self.versions, key=_version_key)

    def version(self, version: str | None) -> ModelVersion | None:
        return self.versions.get(version or self.default_version)

    def data_path(self, root: Path) -> Path:
        return root / self.name / "data" / "test.npz"


_NPZ_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
"""First bytes numpy's ``np.load`` takes for an ``.npz`` (a zip, or an empty zip)."""


def _version_key(version: str) -> tuple[int, str]:
    """Numeric order of version folder names (``"10"`` after ``"9"``)."""
    return (len(version), version)


def read_npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The arrays of an ``.npz`` by key (member name without ``.npy``, as ``np.load`` names them): shape and
    dtype, read from each member's ``.npy`` header only (no data read, nothing unpickled; a few ms).

    Raises:
        ValueError: ``path`` is not an ``.npz`` numpy loads with ``allow_pickle=False``: not a zip, a member
            that is no ``.npy`` array, an object (pickled) array, a member whose size does not match its
            header (truncated). The message says which member and why, without the path.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not head.startswith(_NPZ_MAGIC):
        raise ValueError("not an .npz file (a zip of .npy arrays, as numpy.savez writes); "
                         + ("it is a single .npy array" if head.startswith(b"\x93NUM") else f"it starts with {head!r}"))
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                key = info.filename.removesuffix(".npy")
                with zf.open(info) as fp:
                    try:
                        version = np.lib.format.read_magic(fp)
                    except ValueError:
                        raise ValueError(f"member {info.filename!r} is not a .npy array") from None
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
                    else:  # 3.0 is for structured dtypes with non-latin-1 field names: no input takes them
                        raise ValueError(f"array {key!r}: .npy format version {version[0]}.{version[1]} "
                                         f"(a structured dtype) is not an array of numbers or strings")
                    if dtype.hasobject:
                        raise ValueError(f"array {key!r} holds Python objects (dtype {dtype}), which are pickled "
                                         f"and not loaded (allow_pickle=False); store numbers or fixed-width "
                                         f"strings (numpy.savez of a numeric or str array)")
                    want = fp.tell() + math.prod(shape) * dtype.itemsize
                    if info.file_size != want:
                        raise ValueError(f"array {key!r} has {info.file_size} bytes, its header says {want} "
                                         f"(a truncated or damaged file)")
                out[key] = (tuple(shape), dtype)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"not a readable .npz (zip) file: {exc}") from None
    except (RuntimeError, NotImplementedError, EOFError) as exc:  # encrypted or unsupported compression, cut short
        raise ValueError(f"not a readable .npz (zip) file: {exc}") from None
    return out


def reference_misfit(arrays: dict[str, tuple[tuple[int, ...], np.dtype]], inputs: tuple[TensorInfo, ...],
                     outputs: tuple[TensorInfo, ...] = ()) -> str | None:
    """Why the ``.npz`` arrays ``arrays`` (:func:`read_npz_headers`) cannot be reference rows of a model version
    with ``inputs`` and ``outputs``, or None when they can: the rule of the module docstring, which
    ``load_reference`` and ``load_checked`` (the worker) and ``Workload`` (the load generator) read."""
    if not inputs:
        return "the model has no inputs"
    text = [t for t in (*inputs, *outputs) if t.datatype == "BYTES"]
    if text:  # load_checked compares the outputs as numbers (normalized error): strings cannot be checked
        return (f"{'input' if text[0] in inputs else 'output'} {text[0].name!r} is BYTES, and the precision check "
                f"compares numeric tensors only; leave data/test.npz out for this model")
    for t in inputs:
        key = t.name if t.name in arrays else "X" if len(inputs) == 1 and "X" in arrays else None
        shown = f"input {t.name!r} {t.datatype} {list(t.shape)}"
        if key is None:
            held = ", ".join(repr(k) for k in arrays) or "none"
            need = f"an array {t.name!r}" + (" or 'X'" if len(inputs) == 1 else " (one array per input name)")
            return f"it holds no array for {shown}: needs {need}; holds {held}"
        shape, dtype = arrays[key]
        if not t.shape or t.shape[0] >= 0:
            return (f"{shown} has no dynamic first (batch) dimension, along which reference rows are taken; "
                    f"leave data/test.npz out for this model")
        if len(shape) != len(t.shape):
            return f"array {key!r} of shape {list(shape)} does not fit {shown}: {len(shape)} dimension{'s' * (len(shape) != 1)}, not {len(t.shape)}"
        if shape[0] < 1 or 0 in shape:
            return f"array {key!r} of shape {list(shape)} holds no rows for {shown}"
        for i, (have, want) in enumerate(zip(shape, t.shape)):
            if i and want >= 0 and have != want:
                return (f"array {key!r} of shape {list(shape)} does not fit {shown}: dimension {i} is {have}, "
                        f"not {want}")
        if dtype.kind not in "biuf":
            return f"array {key!r} of dtype {dtype} does not fit {shown}: needs numbers (bool, int, uint or float)"
    return None


def bf16_hint(mv, exc: BaseException) -> str:
    """What to do, appended to ONNX Runtime's failure to load or warm up model version ``mv`` (a
    :class:`ModelVersion`, or None) when it has a BF16 tensor: the runtime's Python API takes no bfloat16 arrays
    (``Numpy_type 256 can't be converted to MLDataType``, which names no cause; a fresh-user trial). ``""`` for any
    other failure."""
    if mv is None or "onnxruntime" not in f"{type(exc).__module__} {exc}".lower():
        return ""
    bf16 = [t.name for t in (*mv.inputs, *mv.outputs) if t.datatype == "BF16"]
    if not bf16:
        return ""
    return (f" (BF16 tensors {bf16}: the onnxruntime backend cannot run them; serve the model with --backend jax, "
            f"or export it with FP32 or FP16 inputs and outputs: docs/accelerators.md, limits)")


def _check_datatypes(inputs, outputs) -> None:
    """Every tensor of a model has an OIP v2 datatype, else ValueError naming the first that has none (an FP8 or a
    sequence input failed at the worker's warm-up with ``KeyError: 'tensor(float8e4m3fn)'``: a fresh-user trial)."""
    from ..schemas import DATATYPES

    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            if t.datatype not in DATATYPES:
                raise ValueError(f"{kind} {t.name!r} is {t.datatype}, which has no KServe Open Inference Protocol v2 "
                                 f"datatype (served: {', '.join(DATATYPES)})")


def _json_kind(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


class ModelRepository:
    """All models found under ``root``.

    Raises:
        ModelConfigError: a model's ``config.json`` is unreadable, not JSON or malformed (a field's type or
            value; a ``default_version`` with no folder; a Triton ensemble or another feature inferbus does not have).
        ModelArtifactError: an unreadable artifact; :class:`ModelVersionsError`, a version folder with a
            leading zero (``01``); :class:`ModelDataError`, a ``data/test.npz`` that cannot be reference rows.
        RepositoryError: a model folder has no versions.
    """

    def __init__(self, root: Path, only: list[str] | None = None, need: dict[str, set[str]] | None = None,
                 configs: dict[str, dict] | None = None) -> None:
        """Read every model folder under ``root`` (only those named in ``only``, when given).

        With ``configs`` (model name → :func:`config_fields`, what the node read when it started: a restarted
        actor), a model named there takes that config and its ``config.json`` is not read again: an edit since the
        start (even into garbage) reaches the actors only through ``inferbus models load`` (docs/models.md), so a
        restarted actor serves what its peers serve.

        With ``need`` (model name → version names: a restarted worker's pinned versions whose files are unchanged),
        the read is tolerant: in each model only the versions in ``need`` must be readable (others that are not are
        left out, as :meth:`scan_model` does; a ``default_version`` whose folder is gone is not an error), and a model
        that still cannot be read is left out of :attr:`models` with its reason in :attr:`unreadable` instead of
        raising (the worker serves the other models).
        """
        self.root = Path(root)
        self.models: dict[str, Model] = {}
        self.unreadable: dict[str, str] = {}
        """Model name → why it was left out (only with ``need``)."""
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} is not a folder")
        self._backend = OnnxRuntimeBackend()
        configs = configs or {}
        for cfg_path in sorted(self.root.glob("*/config.json")):
            config = configs.get(cfg_path.parent.name)
            if need is None:
                model = self._scan(cfg_path.parent, only, config=config)
            else:
                try:
                    model = self._scan(cfg_path.parent, only, need.get(cfg_path.parent.name, set()), pinned=True,
                                       config=config)
                except RepositoryError as exc:
                    self.unreadable[cfg_path.parent.name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                    continue
            if model is not None:
                self.models[model.name] = model
        self.skipped: dict[str, str] = {}
        """Folder name → why a folder that looks like a model's is not one (no ``config.json``; only without
        ``need``): what ``inferbus up`` prints a note of (a Triton repository of ``config.pbtxt`` files was served
        as no models, silently: a fresh-user trial, 2026-12-05)."""
        if need is None:
            for folder in sorted(p for p in self.root.iterdir() if p.is_dir() and (only is None or p.name in only)):
                if (folder / "config.json").exists():
                    continue
                if (folder / "config.pbtxt").exists():
                    self.skipped[folder.name] = ("has a config.pbtxt (Triton's text format) and no config.json: "
                                                 "inferbus reads config.json (its keys in JSON)")
                elif any(v.name.isdigit() and (v / "model.onnx").exists() for v in folder.iterdir() if v.is_dir()):
                    self.skipped[folder.name] = "has version folders with a model.onnx and no config.json"

    def _scan(self, folder: Path, only: list[str] | None = None, need=None, pinned: bool = False,
              config: dict | None = None) -> Model | None:
        """Read one model folder (config, every ``<version>/model.onnx``, the headers of ``data/test.npz``);
        None when ``only`` excludes it. With ``config`` (:func:`config_fields`), that is the model's config and its
        ``config.json`` is not read. With ``need`` (version names), a version not in it whose artifact cannot
        be read, whose folder has a leading zero or whose inputs the reference rows do not fit is left out of
        the model instead of refusing it (a broken new version does not block loading or rolling back to
        another). With ``pinned`` (a restarted worker), a ``default_version`` not on disk is not an error (the
        serving state names the default)."""
        cfg_path = folder / "config.json"
        try:
            # (utf-8-sig: a byte order mark, which editors on Windows write, is read past, as a request body's is)
            raw = {**config, "name": folder.name} if config is not None else \
                json.loads(cfg_path.read_text(encoding="utf-8-sig"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"{cfg_path}: model {folder.name!r}: the config cannot be read as JSON: "
                                   f"{exc}") from exc
        except RecursionError:  # nested deeper than the decoder recurses: no config nests at all
            raise ModelConfigError(f"{cfg_path}: model {folder.name!r}: the config is nested too deeply to read "
                                   f"(it must be a JSON object of the documented fields)") from None
        if not isinstance(raw, dict):
            raise ModelConfigError(f"{cfg_path}: model {folder.name!r}: the config must be a JSON object "
                                   f"({{\"name\": ..., \"max_batch_size\": ...}}), got a JSON {_json_kind(raw)}")
        name = raw.get("name", folder.name)
        if name != folder.name:  # scan_model finds a model's folder by its name; two folders could claim one name
            raise ModelConfigError(f"{cfg_path}: model {folder.name!r}: name must be the folder's name "
                                   f"{folder.name!r} (or left out), got {name!r}")
        if only and name not in only:
            return None
        try:
            cfg = _model_config(raw, name)
        except ValueError as exc:
            raise ModelConfigError(f"{cfg_path}: model {name!r}: {exc}") from None
        versions = {}
        left_out = set()
        vdirs = [d for d in sorted(folder.iterdir())
                 if d.is_dir() and d.name.isascii() and d.name.isdigit() and (d / "model.onnx").is_file()]
        for d in sorted(folder.iterdir()):  # said as such, not "no <version>/model.onnx found" (a fresh-user trial)
            link = d / "model.onnx"
            if d.name.isascii() and d.name.isdigit() and link.is_symlink() and not link.exists() and \
                    (need is None or d.name in need):
                raise ModelArtifactError(f"{link}: model {name!r} version {d.name}: a symbolic link to "
                                         f"{os.readlink(link)}, which does not exist")
        for vdir in vdirs:  # "01" is a second name of version 1: refused, as Triton has one name per version
            if int(vdir.name) > MAX_VERSION:  # served, but no write or default_version could name it (a trial)
                if need is not None and vdir.name not in need:
                    left_out.add(vdir.name)
                    continue
                raise ModelVersionsError(f"{vdir}: model {name!r}: version folder {vdir.name!r} is over "
                                         f"{MAX_VERSION} (versions are 64-bit integers, as Triton's are)")
            if leading_zero_fix(vdir.name) is not None:
                if need is not None and vdir.name not in need:
                    left_out.add(vdir.name)
                    continue
                same = [d.name for d in vdirs if d is not vdir and int(d.name) == int(vdir.name)]
                fix = (f"is version {int(vdir.name)}, as folder {same[0]!r} is; remove one of them" if same else
                       f"has a leading zero; rename it {leading_zero_fix(vdir.name)!r}")
                raise ModelVersionsError(f"{vdir}: model {name!r}: version folder {vdir.name!r} {fix} (versions are "
                                         f"integers, each named by one folder without leading zeros)")
        # the versions config.json's version_policy serves, and those of ``need`` (a load naming its version, the
        # versions an actor's node pinned at start or a serving state names) whatever the policy
        chosen = policy_versions(cfg.version_policy, [d.name for d in vdirs]) if vdirs else None
        if chosen is not None:
            missing = [v for v in cfg.version_policy.get("specific", {}).get("versions", []) if v not in chosen]
            if need is not None:
                chosen |= {d.name for d in vdirs if d.name in need}
            elif missing:
                raise ModelConfigError(f"{cfg_path}: model {name!r}: version_policy {json.dumps(cfg.version_policy)} "
                                       f"names versions with no folder holding a model.onnx: {', '.join(missing)}; on "
                                       f"disk: {', '.join(d.name for d in vdirs)}")
            vdirs = [d for d in vdirs if d.name in chosen]
        for vdir in vdirs:
            artifact = vdir / "model.onnx"
            if vdir.name in left_out:
                continue
            try:
                sess = self._backend.load(artifact)
                try:
                    _check_datatypes(sess.inputs, sess.outputs)
                finally:
                    sess.close()
            except Exception as exc:  # an unreadable artifact: the whole folder is refused, named
                if need is not None and vdir.name not in need:
                    left_out.add(vdir.name)
                    continue
                raise ModelArtifactError(f"{artifact}: model {name!r} version {vdir.name}: "
                                         f"{' '.join(str(exc).replace(str(artifact), 'model.onnx').split())}") from exc
            versions[vdir.name] = ModelVersion(name, vdir.name, artifact, sess.inputs, sess.outputs)
        data = folder / "data" / "test.npz"
        if data.exists() and versions:  # the worker's precision check and the load generator read it
            try:
                arrays = read_npz_headers(data)
            except (OSError, ValueError) as exc:
                raise ModelDataError(f"{data}: model {name!r}: cannot be used as reference rows: "
                                     f"{' '.join(str(exc).split())}") from exc
            for v in sorted(versions, key=_version_key):
                why = reference_misfit(arrays, versions[v].inputs, versions[v].outputs)
                if why is None:
                    continue
                if need is not None and v not in need:  # like an unreadable artifact: only that version left out
                    del versions[v]
                    left_out.add(v)
                    continue
                raise ModelDataError(f"{data}: model {name!r} version {v}: cannot be used as reference rows: {why}")
        if not versions:
            raise RepositoryError(f"{folder}: no <version>/model.onnx found")
        if cfg.default_version is not None and cfg.default_version not in versions \
                and str(cfg.default_version) not in left_out and not pinned:
            on_disk = ", ".join(sorted(versions, key=_version_key))
            if chosen is not None:
                raise ModelConfigError(f"{cfg_path}: model {name!r}: default_version {cfg.default_version!r} is not "
                                       f"among the versions version_policy {json.dumps(cfg.version_policy)} serves "
                                       f"({on_disk})")
            raise ModelConfigError(f"{cfg_path}: model {name!r}: default_version {cfg.default_version!r} is not a "
                                   f"version on disk; the versions (folders holding a model.onnx) are {on_disk}")
        return Model(cfg, versions)

    def scan_model(self, name: str, need=None, config: dict | None = None) -> Model:
        """Read the folder of model ``name`` again (model-management ``load``: a version added on disk
        since start-up is found). Does not change :attr:`models`; blocking (reads each artifact's
        metadata with ONNX Runtime, a few ms per version): call it off the event loop. With ``need`` (a
        collection of version names, e.g. ``{V}`` for ``load --version V``), only those versions' artifacts must
        be readable: others that are not are left out of the returned model. With ``config`` (:func:`config_fields`:
        the one a serving state carries), that is the model's config, and its ``config.json`` is not read.

        Raises:
            ModelConfigError: its ``config.json`` is malformed (see :class:`ModelRepository`).
            ModelArtifactError: an artifact cannot be read, a version folder has a leading zero, or
                ``data/test.npz`` cannot be reference rows (with ``need``: for one of those versions).
            RepositoryError: no folder ``<root>/<name>`` with a ``config.json``, no versions.
        """
        known = self.models.get(name)
        folder = known.versions[next(iter(known.versions))].path.parent.parent if known else self.root / name
        if "/" in name or name in ("", ".", "..") or not (folder / "config.json").is_file():
            raise RepositoryError(f"no model folder {name!r} with a config.json under {self.root}")
        model = self._scan(folder, need=None if need is None else {str(v) for v in need}, config=config)
        assert model is not None
        return model

    def keep_pinned(self, pins) -> None:
        """Keep of each model only the versions in ``pins`` (``"name:version"`` keys: the versions a node served at
        its start, :func:`~inferbus.actors._pinning.pin_repository`); a model left with none is left out. Its default
        is then the configured one, else the highest kept."""
        for name, m in list(self.models.items()):
            kept = {v: mv for v, mv in m.versions.items() if mv.key in pins}
            if not kept:
                del self.models[name]
            elif len(kept) < len(m.versions):
                self.models[name] = Model(m.config, kept)

    def get_version(self, name: str, version: str | None) -> Model | None:
        """Model ``name`` as :meth:`get` gives it, read again with ``version`` when its ``version_policy`` left that
        version out (a deployment may serve it: ``models load NAME --version V``); the load generator reads a
        version's inputs so. Blocking when it reads.

        Raises:
            RepositoryError: the folder cannot be read with that version (see :meth:`scan_model`).
        """
        m = self.models.get(name)
        if m is not None and version and version not in m.versions and m.config.version_policy is not None:
            m = self.models[name] = self.scan_model(name, {version})
        return m

    def get(self, name: str) -> Model | None:
        return self.models.get(name)

    def __iter__(self):
        """The models in name order (the model list, ``<p>.models`` and ``GET /v2/models/stats``, follows it: a model
        withdrawn and loaded again keeps its place)."""
        return iter([self.models[name] for name in sorted(self.models)])

    def __len__(self) -> int:
        return len(self.models)


def config_tensor_mismatches(model: Model) -> list[str]:
    """Where ``model``'s ``config.json`` ``input``/``output`` entries (Triton's: ``name``, ``data_type`` and ``dims``,
    without the batch dimension when ``max_batch_size`` > 0) contradict its default version's ``model.onnx``: a name
    it does not have, another datatype (``TYPE_STRING`` is BYTES), or dims that differ (-1 in either matches any
    size). These keys are not read (names, datatypes and shapes
    come from ``model.onnx``, docs/models.md), so such a config only misleads whoever reads it: a client that sends
    what it says is refused (a fresh-user trial set ``dims: [31]`` on a 30-feature model and got no word). One line
    each, for a note at start-up; entries that are not maps with a ``name`` are passed over."""
    mv = model.version(None)
    if mv is None:
        return []
    out = []
    batched = model.config.max_batch_size > 0
    for key, tensors in (("input", mv.inputs), ("output", mv.outputs)):
        entries = model.config.extra.get(key)
        if not isinstance(entries, list):
            continue
        by_name = {t.name: t for t in tensors}
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                continue
            t = by_name.get(e["name"])
            if t is None:
                out.append(f"config.json names {key} {e['name']!r}, which model.onnx (version {mv.version}) does not "
                           f"have; its {key}s: {', '.join(sorted(by_name))}")
                continue
            dtype = e.get("data_type")
            if isinstance(dtype, str) and dtype.startswith("TYPE_"):  # Triton's TYPE_FP32, TYPE_STRING (= BYTES)
                said = "BYTES" if dtype == "TYPE_STRING" else dtype[len("TYPE_"):]
                if said != t.datatype:
                    out.append(f"config.json gives {key} {e['name']!r} data_type {dtype}, model.onnx (version "
                               f"{mv.version}) {t.datatype}: requests must fit model.onnx")
            dims = e.get("dims")
            if not (isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in dims)):
                continue
            want = list(t.shape[1:] if batched and t.shape else t.shape)
            if len(dims) != len(want) or any(a != b and a != -1 and b != -1 for a, b in zip(dims, want)):
                out.append(f"config.json gives {key} {e['name']!r} dims {dims}, model.onnx (version {mv.version}) "
                           f"{want}{' after the batch dimension' if batched else ''}: requests must fit model.onnx")
    return out


def _model_config(raw: dict, name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a ``config.json`` object ``raw`` of model ``name`` (its unread keys in ``extra``).

    Raises:
        ValueError: a field of the wrong type or out of its range (:class:`ModelConfig`).
    """
    known = set(ModelConfig.__dataclass_fields__) - {"extra"}
    return ModelConfig(**{**{k: v for k, v in raw.items() if k in known}, "name": name},
                       extra={k: v for k, v in raw.items() if k not in known})


CONFIG_FIELDS = ("platform", "max_batch_size", "cache_ttl_ms", "default_version", "description", "hedge_after_ms",
                 "version_policy")
"""The keys of ``config.json`` inferbus reads besides ``name``: what a serving state carries (``ModelState.config``)
and a node hands its actors (``IngressConfig.configs``)."""


def config_fields(cfg: ModelConfig) -> dict:
    """The read keys of ``cfg`` (:data:`CONFIG_FIELDS`), checked values, JSON- and msgpack-encodable."""
    return {k: getattr(cfg, k) for k in CONFIG_FIELDS}


def read_configs(root: Path, only=()) -> dict[str, dict]:
    """Model name → :func:`config_fields` of each model under ``root`` whose ``config.json`` is readable and valid
    (only the models in ``only`` when given; the others are left out: the repository check reports them). Blocking;
    reads the config files only (no artifact). What a node hands its actors at start (``configs``), so that an actor
    it restarts later serves the config it started with, not an edit made on disk since."""
    out = {}
    for cfg_path in sorted(Path(root).glob("*/config.json")):
        name = cfg_path.parent.name
        if only and name not in only:
            continue
        try:
            raw = json.loads(cfg_path.read_text(encoding="utf-8-sig"))
            if not isinstance(raw, dict) or raw.get("name", name) != name:
                continue
            cfg = _model_config(raw, name)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        out[name] = config_fields(cfg)
    return out


def default_models_dir() -> Path:
    """``./models`` if it exists, else the ``models/`` folder of the source checkout."""
    here = Path.cwd() / "models"
    if (here).is_dir() and any(here.glob("*/config.json")):
        return here
    return Path(__file__).resolve().parents[2] / "models"
