"""The model repository's ``config.json`` checks (inferbus/actors/_repository.py): a malformed config is a
ModelConfigError naming the file, the model and the field when the folder is read, never a TypeError or
AttributeError from deep in the actors (found by a fresh-user trial), and a config of defaults is served."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import MODELS
from inferbus.actors import ModelRepository
from inferbus.actors._repository import MAX_BATCH_SIZE, ModelConfigError

pytestmark = pytest.mark.timeout(60)


def _repo_with(tmp_path, config, folder: str = "broken", versions=("1",)):
    """A repository with one model folder holding ``config`` (written as JSON, or as is when a str) and the
    digits model as each of ``versions``."""
    root = tmp_path / "models"
    for v in versions:
        (root / folder / v).mkdir(parents=True)
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", root / folder / v / "model.onnx")
    text = config if isinstance(config, str) else json.dumps(config)
    (root / folder / "config.json").write_text(text)
    return root


def test_the_shipped_configs_pass_the_checks():
    repo = ModelRepository(MODELS)
    assert {"digits", "fraud", "typed", "strings", "digits_cnn"} <= {m.name for m in repo}
    d = repo.get("digits").config
    assert (d.max_batch_size, d.cache_ttl_ms, d.default_version) == (64, 100, "1")
    assert "input" in d.extra and "output" in d.extra  # Triton's tensor lists are kept, unread


def test_an_empty_config_is_the_folder_name_with_the_defaults(tmp_path):
    """``{}`` raised TypeError (missing 'name'): the name defaults to the folder's, as in Triton."""
    repo = ModelRepository(_repo_with(tmp_path, {}, versions=("1", "2")))
    m = repo.get("broken")
    assert m is not None and m.name == "broken"
    assert (m.config.max_batch_size, m.config.cache_ttl_ms, m.config.default_version) == (0, 100, None)
    assert m.default_version == "2"  # the highest version
    assert repo.scan_model("broken").name == "broken"  # model management reads it the same way


@pytest.mark.parametrize("config,said", [
    ([], "the config must be a JSON object"),
    ("null", "the config must be a JSON object"),
    ('"digits"', "the config must be a JSON object"),
    ("{not json", "Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, "the config is nested too deeply to read"),  # was a RecursionError traceback
    ({"name": "broken", "max_batch_size": "x"}, f"max_batch_size must be an integer 0 (no batching) to "
                                                f"{MAX_BATCH_SIZE}, got 'x'"),
    ({"max_batch_size": -1}, "max_batch_size must be an integer"),
    ({"max_batch_size": True}, "max_batch_size must be an integer"),
    ({"max_batch_size": 64_000_000_000}, "max_batch_size must be an integer"),
    ({"name": "broken", "cache_ttl_ms": "abc"}, "cache_ttl_ms must be an integer 0 (no caching) to 86400000 ms, "
                                                "got 'abc'"),
    ({"cache_ttl_ms": -5}, "cache_ttl_ms must be an integer"),
    ({"cache_ttl_ms": 10 ** 30}, "cache_ttl_ms must be an integer"),
    ({"cache_ttl_ms": 0.5}, "cache_ttl_ms must be an integer"),
    ({"name": "broken", "default_version": "9"}, "default_version '9' is not a version on disk; the versions "
                                                 "(folders holding a model.onnx) are 1"),
    ({"default_version": 9}, "default_version '9' is not a version on disk"),
    ({"default_version": "v1"}, "default_version must be a version number"),
    ({"default_version": 1.5}, "default_version must be a version number"),
    ({"name": "other"}, "name must be the folder's name 'broken' (or left out), got 'other'"),
    ({"name": 7}, "name must be the folder's name"),
    ({"platform": 3}, "platform must be a non-empty string"),
    ({"description": ["a"]}, "description must be a string"),
    ({"hedge_after_ms": "p200"}, "hedge_after_ms: hedge policy 'p200': a quantile is p1..p99.9"),
    ({"hedge_after_ms": -1}, "hedge_after_ms: hedge policy -1: a delay must be a finite number of ms > 0"),
    ({"hedge_after_ms": {"ms": 5}}, "hedge_after_ms must be a number of ms > 0"),
])
def test_a_malformed_config_is_refused_naming_the_file_the_model_and_the_field(tmp_path, config, said):
    root = _repo_with(tmp_path, config)
    for read in (lambda: ModelRepository(root), lambda: ModelRepository(root, ["digits"]).scan_model("broken")):
        with pytest.raises(ModelConfigError) as ei:
            read()
        msg = str(ei.value)
        assert msg.startswith(f"{root / 'broken' / 'config.json'}: "), msg
        assert said in msg, msg
        if not isinstance(config, str):
            assert "model 'broken'" in msg, msg


def test_a_folder_name_that_is_no_subject_token_is_refused(tmp_path):
    """The name becomes a subject token (``<p>.infer.<model>``): a folder ``a.b`` would be model a, version b."""
    root = _repo_with(tmp_path, {}, folder="a.b")
    with pytest.raises(ModelConfigError, match=r"a\.b/config\.json: model 'a\.b': name must be a non-empty string "
                                               r"without '\.', '\*', '>' or whitespace"):
        ModelRepository(root)
