"""The model repository: a folder laid out like Triton's.

::

    models/
      <name>/config.json        {"name", "platform", "max_batch_size", "cache_ttl_ms", "default_version", ...}
      <name>/<version>/model.onnx
      <name>/data/test.npz      optional reference rows (X, y) used by ``inferbus bench``

Versions are the numeric sub-folders holding ``model.onnx``; the default version
is ``config.default_version`` or the highest number. Metadata (tensor names,
datatypes, shapes) is read from the artifact with ONNX Runtime.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..accelerators import OnnxRuntimeBackend, TensorInfo


class RepositoryError(ValueError):
    """The model repository is malformed (missing config, bad JSON, no versions)."""


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
    """A model's ``config.json``."""

    name: str
    platform: str = "onnxruntime_onnx"
    max_batch_size: int = 0
    """Largest batch the worker may form from queued requests (0 = no batching)."""
    cache_ttl_ms: int = 100
    """Result cache TTL in ms; 0 disables caching for the model."""
    default_version: str | None = None
    description: str = ""
    hedge_after_ms: float | None = None
    extra: dict = field(default_factory=dict)


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


class ModelRepository:
    """All models found under ``root``.

    Raises:
        RepositoryError: a model folder has an unreadable config or no versions.
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

    def _scan(self, folder: Path, only: list[str] | None = None) -> Model | None:
        """Read one model folder (config and every ``<version>/model.onnx``); None when ``only`` excludes it."""
        cfg_path = folder / "config.json"
        try:
            raw = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RepositoryError(f"{cfg_path}: {exc}") from exc
        name = raw.get("name", folder.name)
        if only and name not in only:
            return None
        known = set(ModelConfig.__dataclass_fields__) - {"extra"}
        cfg = ModelConfig(**{k: v for k, v in raw.items() if k in known},
                          extra={k: v for k, v in raw.items() if k not in known})
        if cfg.default_version is not None:
            object.__setattr__(cfg, "default_version", str(cfg.default_version))
        versions = {}
        for vdir in sorted(folder.iterdir()):
            artifact = vdir / "model.onnx"
            if vdir.is_dir() and vdir.name.isascii() and vdir.name.isdigit() and artifact.is_file():
                try:
                    sess = self._backend.load(artifact)
                except Exception as exc:  # an unreadable artifact: the whole folder is refused, named
                    raise RepositoryError(f"{artifact}: {exc}") from exc
                versions[vdir.name] = ModelVersion(name, vdir.name, artifact, sess.inputs, sess.outputs)
                sess.close()
        if not versions:
            raise RepositoryError(f"{folder}: no <version>/model.onnx found")
        return Model(cfg, versions)

    def scan_model(self, name: str) -> Model:
        """Read the folder of model ``name`` again (model-management ``load``: a version added on disk
        since start-up is found). Does not change :attr:`models`; blocking (reads each artifact's
        metadata with ONNX Runtime, a few ms per version): call it off the event loop.

        Raises:
            RepositoryError: no folder ``<root>/<name>`` with a ``config.json``, or it is malformed.
        """
        known = self.models.get(name)
        folder = known.versions[next(iter(known.versions))].path.parent.parent if known else self.root / name
        if "/" in name or name in ("", ".", "..") or not (folder / "config.json").is_file():
            raise RepositoryError(f"no model folder {name!r} with a config.json under {self.root}")
        model = self._scan(folder)
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
