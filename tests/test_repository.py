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
    (root / folder).mkdir(parents=True, exist_ok=True)
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
    ({"name": "broken", "max_batch_size": "x"}, f"max_batch_size must be an integer in [0, {MAX_BATCH_SIZE}] (0 = "
                                                f"no batching), got 'x'"),
    ({"max_batch_size": -1}, "max_batch_size must be an integer"),
    ({"max_batch_size": True}, "max_batch_size must be an integer"),
    ({"max_batch_size": 64_000_000_000}, "max_batch_size must be an integer"),
    ({"name": "broken", "cache_ttl_ms": "abc"}, "cache_ttl_ms must be an integer in [0, 86,400,000] ms (0 = no "
                                                "caching), got 'abc'"),
    ({"name": "broken", "cache_ttl_ms": -5}, "cache_ttl_ms must be an integer in [0, 86,400,000] ms (0 = no "
                                             "caching), got -5"),
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
    ({"hedge_after_ms": "p200"}, "hedge_after_ms: hedge policy 'p200': a quantile is pNN with 0 < NN < 100"),
    ({"hedge_after_ms": -1}, "hedge_after_ms: hedge policy -1: a delay must be a finite number of ms > 0"),
    ({"hedge_after_ms": {"ms": 5}}, "hedge_after_ms must be a number of ms > 0"),
    # Triton features inferbus does not have, which serving model.onnx alone would silently answer otherwise
    ({"platform": "ensemble"}, 'platform "ensemble": Triton ensembles are not supported'),
    ({"platform": "ENSEMBLE"}, 'platform "ensemble": Triton ensembles are not supported'),  # (was served, a trial)
    ({"backend": "Python "}, 'backend "python" is not supported'),
    ({"ensemble_scheduling": {"step": []}}, "ensemble_scheduling: Triton ensembles are not supported"),
    ({"sequence_batching": {}}, "sequence_batching is not supported: Triton's sequence batcher serves stateful"),
    ({"backend": "python"}, 'backend "python" is not supported: a Triton Python-backend model is the code of its '
                            'model.py'),
    ({"model_transaction_policy": {"decoupled": True}}, "model_transaction_policy.decoupled is not supported"),
    ({"default_model_filename": "model.plan"}, "default_model_filename 'model.plan' is not supported: inferbus reads "
                                               "<version>/model.onnx only"),
    # (a trial: the string was served silently, as a decoupled model it is not)
    ({"model_transaction_policy": {"decoupled": "true"}}, "model_transaction_policy.decoupled is not supported"),
    ({"model_transaction_policy": {"decoupled": 1}}, "model_transaction_policy.decoupled must be false (or left out), "
                                                     "got 1"),
    # Triton's version_policy, read since 2026-12-06 (it was not read: every version served, a trial)
    ({"version_policy": "latest"}, "version_policy must be one of {\"all\": {}}, {\"latest\": {\"num_versions\": N}}"),
    ({"version_policy": {"latest": {"num_versions": 0}}}, "version_policy.latest must be {\"num_versions\": N} with an "
                                                          "integer N >= 1, got {\"num_versions\": 0}"),  # (JSON, not Python's repr)
    ({"version_policy": {"latest": {"num_versions": True}}}, "version_policy.latest must be"),
    ({"version_policy": {"all": {"x": 1}}}, "version_policy.all takes no keys"),
    ({"version_policy": {"all": {}, "latest": {"num_versions": 1}}}, "version_policy must be one of"),
    ({"version_policy": {"specific": {"versions": []}}}, "version_policy.specific must be {\"versions\": [...]}, a "
                                                         "non-empty list of version numbers"),
    ({"version_policy": {"specific": {"versions": ["v1"]}}}, "version_policy.specific must be"),
    ({"version_policy": {"specific": {"versions": ["01"]}}}, "version_policy.specific.versions: '01' has a leading "
                                                             "zero: write '1'"),
    ({"version_policy": {"specific": {"versions": [2]}}},
     'version_policy {"specific": {"versions": ["2"]}} names versions with no folder holding a model.onnx: 2; on disk: 1'),
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


# ---- Triton's config keys: those inferbus cannot honour are refused, the others kept unread ----------------------

_ENSEMBLE = {"name": "pipe", "platform": "ensemble", "max_batch_size": 64,
             "input": [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [64]}],
             "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}],
             "ensemble_scheduling": {"step": [{"model_name": "digits", "model_version": -1,
                                               "input_map": {"pixels": "pixels"}, "output_map": {"logits": "logits"}}]}}


@pytest.mark.parametrize("with_onnx", [True, False], ids=["next-to-a-model-onnx", "triton-layout"])
def test_a_triton_ensemble_is_refused_naming_the_model(tmp_path, with_onnx):
    """An ensemble's config next to a model.onnx was served as that model (``inferbus models`` listed platform
    "ensemble"); a Triton ensemble folder (an empty version folder) was refused with only ``no <version>/model.onnx
    found``. Both are now the ModelConfigError of a malformed config naming the model and saying why; a tolerant
    reader (a restarted actor) leaves it out as unreadable and serves the ensemble's step."""
    root = _repo_with(tmp_path, _ENSEMBLE, folder="pipe", versions=("1",) if with_onnx else ())
    (root / "pipe" / "1").mkdir(exist_ok=True)  # Triton's layout: an ensemble's version folder is empty
    shutil.copytree(MODELS / "digits", root / "digits")
    said = (f"{root / 'pipe' / 'config.json'}: model 'pipe': platform \"ensemble\" and ensemble_scheduling: Triton "
            f"ensembles are not supported: inferbus serves each model's <version>/model.onnx on its own")
    for read in (lambda: ModelRepository(root), lambda: ModelRepository(root, ["digits"]).scan_model("pipe")):
        with pytest.raises(ModelConfigError) as ei:
            read()
        assert str(ei.value).startswith(said), str(ei.value)
    tolerant = ModelRepository(root, need={})
    assert list(tolerant.models) == ["digits"]
    assert tolerant.unreadable["pipe"].startswith(f"ModelConfigError: {said}"), tolerant.unreadable


def test_the_triton_keys_inferbus_does_not_read_are_kept_unread(tmp_path):
    """Only what cannot be honoured is refused: the same keys with values inferbus serves alike, and the keys that
    tune Triton's own scheduling and placement, are allowed and kept in ``extra``."""
    config = {"backend": "onnxruntime", "default_model_filename": "model.onnx", "ensemble_scheduling": None,
              "sequence_batching": None, "model_transaction_policy": {"decoupled": False},
              "dynamic_batching": {"max_queue_delay_microseconds": 100}, "version_policy": {"all": {}},
              "instance_group": [{"count": 2, "kind": "KIND_CPU"}], "response_cache": {"enable": True},
              "parameters": {"intra_op_thread_count": {"string_value": "1"}}}
    m = ModelRepository(_repo_with(tmp_path, config)).get("broken")
    read = {"version_policy": {"all": {}}}  # (read since 2026-12-06)
    assert m is not None and m.config.platform == "onnxruntime_onnx"
    assert m.config.extra == {k: v for k, v in config.items() if k not in read}
    assert m.config.version_policy == read["version_policy"]


# ---- version folders: integers, one name each (a user trial served 1 and 01 as two versions) ----------------

def test_version_folders_with_a_leading_zero_are_refused_naming_them(tmp_path):
    from inferbus.actors._repository import ModelArtifactError, ModelVersionsError

    root = _repo_with(tmp_path, {}, versions=("1", "01"))
    with pytest.raises(ModelVersionsError) as ei:
        ModelRepository(root)
    msg = str(ei.value)
    assert msg.startswith(f"{root / 'broken' / '01'}: model 'broken': version folder '01' is version 1, as folder "
                          f"'1' is; remove one of them"), msg
    assert isinstance(ei.value, ModelArtifactError)  # models load answers INVALID_ARGUMENT for it (_models._load)
    with pytest.raises(ModelVersionsError, match="version folder '007' has a leading zero; rename it '7'"):
        ModelRepository(_repo_with(tmp_path / "b", {}, versions=("007",)))
    with pytest.raises(ModelVersionsError):  # models load NAME (every version) reads the folder the same way
        ModelRepository(root, ["digits"]).scan_model("broken")
    # models load NAME --version 1: the folder 01 is left out, as a broken artifact of another version is
    assert sorted(ModelRepository(root, ["digits"]).scan_model("broken", {"1"}).versions) == ["1"]
    with pytest.raises(ModelVersionsError):
        ModelRepository(root, ["digits"]).scan_model("broken", {"01"})


def test_a_tensor_without_an_oip_datatype_is_refused_when_the_repository_is_read(tmp_path):
    """An FP8 input passed the repository's read and failed at each worker's warm-up, ``KeyError:
    'tensor(float8e4m3fn)'`` (a fresh-user trial, 2026-12-05); now one line naming the tensor, before any actor."""
    from onnx import TensorProto, helper

    from inferbus.actors._repository import ModelArtifactError

    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "f8",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    (tmp_path / "f8" / "1").mkdir(parents=True)
    (tmp_path / "f8" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "f8" / "config.json").write_text("{}")
    with pytest.raises(ModelArtifactError) as ei:
        ModelRepository(tmp_path)
    assert str(ei.value).startswith(f"{tmp_path / 'f8' / '1' / 'model.onnx'}: model 'f8' version 1: input 'x' is "
                                    f"tensor(float8e4m3fn), which has no KServe Open Inference Protocol v2 "
                                    f"datatype"), ei.value


def test_a_broken_model_link_is_named(tmp_path):
    """A ``model.onnx`` that is a broken symbolic link was reported as "no <version>/model.onnx found"."""
    from inferbus.actors._repository import ModelArtifactError

    root = _repo_with(tmp_path, {}, versions=("1",))
    (root / "broken" / "2").mkdir()
    (root / "broken" / "2" / "model.onnx").symlink_to(tmp_path / "gone.onnx")
    with pytest.raises(ModelArtifactError) as ei:
        ModelRepository(root)
    assert str(ei.value) == (f"{root / 'broken' / '2' / 'model.onnx'}: model 'broken' version 2: a symbolic link to "
                             f"{tmp_path / 'gone.onnx'}, which does not exist"), ei.value


def test_a_version_folder_past_64_bits_is_refused(tmp_path):
    """A 30-digit version folder was served, and then no write (``models default``) nor ``default_version`` could
    name it (a fresh-user trial, 2026-12-05): refused as Triton's int64 versions would be; 2**63 - 1 is served."""
    from inferbus.actors._repository import MAX_VERSION, ModelVersionsError

    for big in ("123456789012345678901234567890", str(MAX_VERSION + 1)):
        with pytest.raises(ModelVersionsError, match=f"version folder '{big}' is over {MAX_VERSION}"):
            ModelRepository(_repo_with(tmp_path / big, {}, versions=("1", big)))
    top = str(MAX_VERSION)
    assert ModelRepository(_repo_with(tmp_path / "top", {}, versions=("1", top))).get("broken").default_version == top


def test_the_default_version_is_the_highest_number_not_the_highest_string(tmp_path):
    root = _repo_with(tmp_path, {}, versions=("9", "10", "2"))
    assert ModelRepository(root).get("broken").default_version == "10"
    # a default_version given as "01" or 1 is version 1 (it was NOT a version on disk for "01")
    for i, given in enumerate(("01", 1, "1")):
        root = _repo_with(tmp_path / str(i), {"default_version": given}, versions=("1", "10"))
        m = ModelRepository(root).get("broken")
        assert (m.config.default_version, m.default_version) == ("1", "1")


# ---- data/test.npz: reference rows the worker's precision check and the load generator can both use --------

def _with_data(tmp_path, write, model="digits"):
    """A copy of the shipped ``model`` whose ``data/test.npz`` is written by ``write(path)``."""
    root = tmp_path / "models"
    shutil.copytree(MODELS / model, root / model)
    path = root / model / "data" / "test.npz"
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    write(path)
    return root, path


def _npz(**arrays):
    import numpy as np

    return lambda path: np.savez(path, **arrays)


@pytest.mark.parametrize("write,said", [
    (lambda p: p.write_text("junk\n"), "not an .npz file (a zip of .npy arrays, as numpy.savez writes); it starts "
                                       "with b'junk'"),
    (lambda p: __import__("numpy").save(open(p, "wb"), __import__("numpy").zeros((3, 64))),
     "not an .npz file (a zip of .npy arrays, as numpy.savez writes); it is a single .npy array"),
    (lambda p: p.write_bytes(b"PK\x03\x04" + b"\0" * 40), "not a readable .npz (zip) file"),
    (_npz(X=__import__("numpy").array([{"x": 1}], dtype=object)), "array 'X' holds Python objects (dtype object), "
                                                                 "which are pickled and not loaded"),
    (_npz(y=__import__("numpy").zeros(3, dtype=object)), "array 'y' holds Python objects"),  # even one not read
    (_npz(X=__import__("numpy").zeros((5, 63), "float32")), "version 1: cannot be used as reference rows: array 'X' "
                                                            "of shape [5, 63] does not fit input 'pixels' FP32 "
                                                            "[-1, 64]: dimension 1 is 63, not 64"),
    (_npz(X=__import__("numpy").zeros(64, "float32")), "array 'X' of shape [64] does not fit input 'pixels' FP32 "
                                                       "[-1, 64]: 1 dimension, not 2"),
    (_npz(X=__import__("numpy").zeros((0, 64), "float32")), "array 'X' of shape [0, 64] holds no rows"),
    (_npz(X=__import__("numpy").full((5, 64), "a")), "array 'X' of dtype <U1 does not fit input 'pixels' FP32 "
                                                     "[-1, 64]: needs numbers"),
    (_npz(features=__import__("numpy").zeros((5, 64))), "it holds no array for input 'pixels' FP32 [-1, 64]: "
                                                        "needs an array 'pixels' or 'X'; holds 'features'"),
])
def test_a_test_npz_that_cannot_be_reference_rows_is_refused_naming_it(tmp_path, write, said):
    """It crashed every worker at start (a 185-line traceback from np.load or ONNX Runtime): now the repository
    refuses it when read, naming the file and why, from the arrays' headers."""
    from inferbus.actors._repository import ModelArtifactError, ModelDataError

    root, path = _with_data(tmp_path, write)
    for read in (lambda: ModelRepository(root), lambda: ModelRepository(root, ["fraud"]).scan_model("digits")):
        with pytest.raises(ModelDataError) as ei:
            read()
        msg = str(ei.value)
        assert msg.startswith(f"{path}: model 'digits'"), msg
        assert "cannot be used as reference rows" in msg and said in msg, msg
        assert "\n" not in msg
        assert isinstance(ei.value, ModelArtifactError)  # INVALID_ARGUMENT for models load


def test_reference_rows_of_a_model_with_bytes_tensors_are_refused(tmp_path):
    """load_checked compares outputs as numbers: a test.npz next to the strings model crashed the worker."""
    import numpy as np

    from inferbus.actors._repository import ModelDataError

    root, _ = _with_data(tmp_path, lambda p: np.savez(p, X=np.array([["a"]])), model="strings")
    with pytest.raises(ModelDataError, match="input 's' is BYTES, and the precision check compares numeric tensors"):
        ModelRepository(root)


def test_what_passes_the_check_is_used_by_the_precision_check_and_the_load_generator(tmp_path):
    """The rule is what load_reference (the input's name, else X) and Workload read: an array named after the
    input, of ints, is cast and replayed one row a request; several inputs take one array each."""
    import numpy as np

    from inferbus.accelerators import OnnxRuntimeBackend, load_checked
    from inferbus.loadgen import Workload

    rows = np.arange(10 * 64, dtype=np.int32).reshape(10, 64)
    root, path = _with_data(tmp_path, lambda p: np.savez(p, pixels=rows, y=np.zeros(10)))
    repo = ModelRepository(root)
    sess = load_checked(OnnxRuntimeBackend(), root / "digits" / "1" / "model.onnx", reference_path=path)
    assert sess.report.rows == 10 and sess.report.max_error == 0.0
    w = Workload(repo, "digits", "1", pool=12)
    assert w.inputs[0]["pixels"].shape == (1, 64) and w.inputs[0]["pixels"].dtype == np.float32
    assert len({x["pixels"].tobytes() for x in w.inputs}) == 12  # distinct past the 10 rows
    shutil.copytree(MODELS / "typed", root / "typed")
    (root / "typed" / "data").mkdir()
    np.savez(root / "typed" / "data" / "test.npz", a=np.arange(5).reshape(5, 1), b=np.ones((5, 4)))
    sess = load_checked(OnnxRuntimeBackend(), root / "typed" / "1" / "model.onnx",
                        reference_path=root / "typed" / "data" / "test.npz")
    assert ModelRepository(root).get("typed") is not None and sess.report.rows == 5


def test_a_test_npz_that_fits_one_version_only_blocks_only_the_other_with_need(tmp_path):
    """Like an unreadable artifact: ``models load NAME --version V`` is not blocked by another version's misfit."""
    import numpy as np

    from inferbus.actors._repository import ModelDataError

    root, _ = _with_data(tmp_path, lambda p: np.savez(p, X=np.zeros((3, 30), "float32")), model="fraud")
    (root / "fraud" / "2").mkdir()
    shutil.copy(MODELS / "digits" / "1" / "model.onnx", root / "fraud" / "2" / "model.onnx")  # 64 wide
    with pytest.raises(ModelDataError, match="version 2: .*dimension 1 is 30, not 64"):
        ModelRepository(root)
    assert sorted(ModelRepository(root, ["digits"]).scan_model("fraud", {"1"}).versions) == ["1"]


@pytest.mark.parametrize("policy,served,default", [
    (None, ["1", "2", "3"], "3"),
    ({"all": {}}, ["1", "2", "3"], "3"),
    ({"latest": {"num_versions": 1}}, ["3"], "3"),  # Triton's default, when written out
    ({"latest": {"num_versions": 2}}, ["2", "3"], "3"),
    ({"latest": {"num_versions": 9}}, ["1", "2", "3"], "3"),
    ({"specific": {"versions": [1]}}, ["1"], "1"),
    ({"specific": {"versions": ["3", 1]}}, ["1", "3"], "3"),  # (int64s in Triton's JSON: numbers or strings)
])
def test_version_policy_chooses_the_versions_served_as_tritons_does(tmp_path, policy, served, default):
    """A trial: ``{"specific": {"versions": [1]}}`` beside versions 1 and 2 served both, and an unversioned request
    got version 2's answer where Triton serves version 1 only. The policy now chooses what a read of the folder
    serves; versions it leaves out are not even opened (a broken one does not block the rest); a read that needs a
    version (``models load NAME --version V``, a restarted actor's pinned versions) gets it whatever the policy."""
    root = _repo_with(tmp_path, {} if policy is None else {"version_policy": policy}, versions=("1", "2", "3"))
    left_out = sorted({"1", "2", "3"} - set(served))
    for v in left_out:
        (root / "broken" / v / "model.onnx").write_bytes(b"not onnx")
    m = ModelRepository(root).get("broken")
    assert sorted(m.versions) == served and m.default_version == default
    assert sorted(ModelRepository(root, ["digits"]).scan_model("broken").versions) == served  # a load, no version
    if left_out:
        shutil.copy(MODELS / "digits" / "1" / "model.onnx", root / "broken" / left_out[0] / "model.onnx")
        asked = ModelRepository(root, ["digits"]).scan_model("broken", {left_out[0]})
        assert left_out[0] in asked.versions and set(served) <= set(asked.versions), sorted(asked.versions)


def test_a_default_version_that_the_version_policy_leaves_out_is_refused(tmp_path):
    root = _repo_with(tmp_path, {"version_policy": {"latest": {"num_versions": 1}}, "default_version": 1},
                      versions=("1", "2"))
    with pytest.raises(ModelConfigError, match="default_version '1' is not among the versions version_policy "
                                               "{\"latest\": {\"num_versions\": 1}} serves \\(2\\)"):
        ModelRepository(root)


def test_a_config_with_a_byte_order_mark_is_read(tmp_path):
    """Editors on Windows write one; it was refused ("Unexpected UTF-8 BOM"), where a request body may carry one."""
    root = _repo_with(tmp_path, "\ufeff" + json.dumps({"max_batch_size": 4}))
    assert ModelRepository(root).get("broken").config.max_batch_size == 4
