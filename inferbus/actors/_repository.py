"""The model repository: a folder laid out like Triton's.

::

    models/
      <name>/config.json        {"name", "platform", "max_batch_size", "cache_ttl_ms", "default_version", ...}
      <name>/<version>/model.onnx
      <name>/data/test.npz      optional reference rows (X, y) used by ``inferbus bench``

Versions are the numeric sub-folders holding ``model.onnx``; the default version
is ``config.default_version`` or the highest number. Metadata (tensor names,
datatypes, shapes) is read from the artifact with ONNX Runtime.

``config.json`` is one JSON object, checked when the folder is read (:class:`ModelConfig`);
a malformed one is a :class:`ModelConfigError` naming the file, the model and the field:

=====================  ===========================================================  ==================
key                    allowed                                                      absent
=====================  ===========================================================  ==================
``name``               the folder's name (one NATS subject token)                   the folder's name
``platform``           a non-empty string (reported in the metadata)                ``onnxruntime_onnx``
``max_batch_size``     an integer 0 to :data:`MAX_BATCH_SIZE` (0 = no batching)     0
``cache_ttl_ms``       an integer 0 to :data:`MAX_CACHE_TTL_MS` (0 = no caching)    100
``default_version``    a version on disk, as an integer or a string of digits       the highest version
``description``        a string                                                     ``""``
``hedge_after_ms``     null, ``"off"``, a number of ms > 0, ``"pNN"`` or ``"auto"``  no hedging
=====================  ===========================================================  ==================

Other keys (Triton's ``input``/``output`` lists, ...) are kept in ``ModelConfig.extra`` unread.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..accelerators import OnnxRuntimeBackend, TensorInfo
from ._hedge import HedgePolicyError, parse_policy

MAX_BATCH_SIZE = 65_536
"""Largest ``max_batch_size`` a model's config may give: each worker warms the model up at every power of two
up to it (a typo such as ``64000000000`` would allocate that many rows and kill the worker at start)."""
MAX_CACHE_TTL_MS = 86_400_000
"""Longest ``cache_ttl_ms`` a model's config may give: one day (the value travels as an integer in the
ingresses' cache-fill messages, which a 20-digit one would not fit)."""


class RepositoryError(ValueError):
    """The model repository is malformed (missing config, bad JSON, no versions, unreadable artifact)."""


class ModelArtifactError(RepositoryError):
    """A model version's ``model.onnx`` is there but cannot be read as a model (the message names the file and
    the runtime's reason)."""


class ModelConfigError(RepositoryError):
    """A model's ``config.json`` is not a JSON object of the allowed keys and values (the message names the
    file, the model and the field)."""


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
            allowed form). :meth:`ModelRepository._scan` turns it into a :class:`ModelConfigError` naming
            the file and the model.
    """

    name: str
    """The model's name: one NATS subject token (no ``.``, ``*``, ``>`` or whitespace)."""
    platform: str = "onnxruntime_onnx"
    max_batch_size: int = 0
    """Largest batch the worker may form from queued requests (0 = no batching), 0 to :data:`MAX_BATCH_SIZE`."""
    cache_ttl_ms: int = 100
    """Result cache TTL in ms; 0 disables caching for the model. 0 to :data:`MAX_CACHE_TTL_MS`."""
    default_version: str | None = None
    """The version serving requests that name none (a string of digits; an integer is taken as its decimal
    string); None = the highest version on disk."""
    description: str = ""
    hedge_after_ms: float | str | None = None
    """Hedge policy (:func:`~inferbus.actors._hedge.parse_policy`): None/``"off"``, ms > 0, ``"pNN"``, ``"auto"``."""
    extra: dict = field(default_factory=dict)
    """The other keys of ``config.json``, unread."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _is_token(self.name):
            raise ValueError(f"name must be a non-empty string without '.', '*', '>' or whitespace (one NATS "
                             f"subject token), got {self.name!r}")
        if not isinstance(self.platform, str) or not self.platform:
            raise ValueError(f"platform must be a non-empty string (e.g. \"onnxruntime_onnx\"), got {self.platform!r}")
        if not _is_int(self.max_batch_size) or not 0 <= self.max_batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"max_batch_size must be an integer 0 (no batching) to {MAX_BATCH_SIZE}, got "
                             f"{self.max_batch_size!r}")
        if not _is_int(self.cache_ttl_ms) or not 0 <= self.cache_ttl_ms <= MAX_CACHE_TTL_MS:
            raise ValueError(f"cache_ttl_ms must be an integer 0 (no caching) to {MAX_CACHE_TTL_MS} ms, got "
                             f"{self.cache_ttl_ms!r}")
        v = self.default_version
        if _is_int(v) and v >= 0:
            object.__setattr__(self, "default_version", str(v))
        elif v is not None and not (isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 20):
            raise ValueError(f"default_version must be a version number (an integer or a string of digits, the "
                             f"name of a version folder) or null, got {v!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"description must be a string, got {self.description!r}")
        if not (self.hedge_after_ms is None or isinstance(self.hedge_after_ms, (str, int, float))):
            raise ValueError(f"hedge_after_ms must be a number of ms > 0, 'off', 'pNN' (e.g. 'p95') or 'auto', "
                             f"got {self.hedge_after_ms!r}")
        try:
            parse_policy(self.hedge_after_ms)
        except HedgePolicyError as exc:
            raise ValueError(f"hedge_after_ms: {exc}") from None


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
        return max(self.versions, key=lambda v: (len(v), v))

    def version(self, version: str | None) -> ModelVersion | None:
        return self.versions.get(version or self.default_version)

    def data_path(self, root: Path) -> Path:
        return root / self.name / "data" / "test.npz"


def _json_kind(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


class ModelRepository:
    """All models found under ``root``.

    Raises:
        ModelConfigError: a model's ``config.json`` is unreadable, not JSON or malformed (a field's type or
            value; a ``default_version`` with no folder).
        RepositoryError: a model folder has no versions or an unreadable artifact.
    """

    def __init__(self, root: Path, only: list[str] | None = None) -> None:
        self.root = Path(root)
        self.models: dict[str, Model] = {}
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} is not a folder")
        self._backend = OnnxRuntimeBackend()
        for cfg_path in sorted(self.root.glob("*/config.json")):
            model = self._scan(cfg_path.parent, only)
            if model is not None:
                self.models[model.name] = model

    def _scan(self, folder: Path, only: list[str] | None = None, need=None) -> Model | None:
        """Read one model folder (config and every ``<version>/model.onnx``); None when ``only`` excludes it.
        With ``need`` (version names), a version not in it whose artifact cannot be read is left out of the
        model instead of refusing it (a broken new version does not block loading or rolling back to another)."""
        cfg_path = folder / "config.json"
        try:
            raw = json.loads(cfg_path.read_text())
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
        known = set(ModelConfig.__dataclass_fields__) - {"extra"}
        try:
            cfg = ModelConfig(**{**{k: v for k, v in raw.items() if k in known}, "name": name},
                              extra={k: v for k, v in raw.items() if k not in known})
        except ValueError as exc:
            raise ModelConfigError(f"{cfg_path}: model {name!r}: {exc}") from None
        versions = {}
        left_out = set()
        for vdir in sorted(folder.iterdir()):
            artifact = vdir / "model.onnx"
            if vdir.is_dir() and vdir.name.isascii() and vdir.name.isdigit() and artifact.is_file():
                try:
                    sess = self._backend.load(artifact)
                except Exception as exc:  # an unreadable artifact: the whole folder is refused, named
                    if need is not None and vdir.name not in need:
                        left_out.add(vdir.name)
                        continue
                    raise ModelArtifactError(f"{artifact}: model {name!r} version {vdir.name}: "
                                             f"{' '.join(str(exc).replace(str(artifact), 'model.onnx').split())}") from exc
                versions[vdir.name] = ModelVersion(name, vdir.name, artifact, sess.inputs, sess.outputs)
                sess.close()
        if not versions:
            raise RepositoryError(f"{folder}: no <version>/model.onnx found")
        if cfg.default_version is not None and cfg.default_version not in versions \
                and str(cfg.default_version) not in left_out:
            on_disk = ", ".join(sorted(versions, key=lambda v: (len(v), v)))
            raise ModelConfigError(f"{cfg_path}: model {name!r}: default_version {cfg.default_version!r} is not a "
                                   f"version on disk; the versions (folders holding a model.onnx) are {on_disk}")
        return Model(cfg, versions)

    def scan_model(self, name: str, need=None) -> Model:
        """Read the folder of model ``name`` again (model-management ``load``: a version added on disk
        since start-up is found). Does not change :attr:`models`; blocking (reads each artifact's
        metadata with ONNX Runtime, a few ms per version): call it off the event loop. With ``need`` (a
        collection of version names, e.g. ``{V}`` for ``load --version V``), only those versions' artifacts must
        be readable: others that are not are left out of the returned model.

        Raises:
            ModelConfigError: its ``config.json`` is malformed (see :class:`ModelRepository`).
            ModelArtifactError: an artifact cannot be read (with ``need``: one of those versions').
            RepositoryError: no folder ``<root>/<name>`` with a ``config.json``, no versions.
        """
        known = self.models.get(name)
        folder = known.versions[next(iter(known.versions))].path.parent.parent if known else self.root / name
        if "/" in name or name in ("", ".", "..") or not (folder / "config.json").is_file():
            raise RepositoryError(f"no model folder {name!r} with a config.json under {self.root}")
        model = self._scan(folder, need=None if need is None else {str(v) for v in need})
        assert model is not None
        return model

    def get(self, name: str) -> Model | None:
        return self.models.get(name)

    def __iter__(self):
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)


def default_models_dir() -> Path:
    """``./models`` if it exists, else the ``models/`` folder of the source checkout."""
    here = Path.cwd() / "models"
    if (here).is_dir() and any(here.glob("*/config.json")):
        return here
    return Path(__file__).resolve().parents[2] / "models"
