"""Triton's statistics and model repository extensions on the node's HTTP port (``inferbus up --http-port 0
--http-model-control``; docs/http.md): ``GET /v2/models[/<m>[/versions/<v>]]/stats``, ``POST /v2/repository/index``,
``POST /v2/repository/models/<m>/load|unload``, against a real node (1 ingress, 1 worker, embedded NATS and Valkey),
each answer checked against what the node says over NATS and on ``/metrics``. The last test makes the node's region
gate refuse writes (for 60 s): keep it last. The gate without ``--http-model-control``: tests/test_http_probes.py."""

from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pytest

from conftest import MODELS, start_deployment
from inferbus.schemas import NotFound
from test_http_infer import ask, deep_json, no_traceback_in_the_logs, post_json, serving

pytestmark = pytest.mark.timeout(120)

STAT_KEYS = {"success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("http_ext")
    yield from serving(start_deployment(root / "dep", workers=1, prefix="hx",
                                        extra=["--ingress", "1", "--http-port", "0", "--http-host", "127.0.0.1",
                                               "--http-model-control"]))


def stats_of(node, path: str) -> list[dict]:
    status, headers, body = ask(node, path)
    assert status == 200 and headers["content-type"] == "application/json", (path, status, body)
    assert "inferbus-stats-missing" not in headers, headers
    return json.loads(body)["model_stats"]


def scraped(node, family: str, model: str, version: str) -> float:
    """The sum over the node's processes of a ``/metrics`` family's samples for one model version."""
    status, _, body = ask(node, "/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(family + "{") and f'model="{model}"' in line and f'version="{version}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_stats_count_what_the_node_served_as_its_metrics_do(node):
    """N distinct requests to digits v2 over NATS move ``inference_count``, ``execution_count``, ``success`` and
    ``compute_infer`` by N (one request per run: no batching here) and ``last_inference`` into the time they were
    sent; a refused request moves ``fail``; the figures equal the ``/metrics`` counters of the same moment; the
    fields Triton's clients read are all there (0 where inferbus does not measure them, docs/http.md)."""
    rng = np.random.default_rng(7)
    before = stats_of(node, "/v2/models/digits/versions/2/stats")
    assert [(s["name"], s["version"]) for s in before] == [("digits", "2")]
    t0_ms = time.time() * 1000
    n = 4
    for _ in range(n):
        node.client.infer("digits", {"pixels": rng.random((1, 64), dtype=np.float32)}, version="2")
    with pytest.raises(Exception):
        node.client.infer("digits", {"pixels": np.zeros((1, 63), np.float32)}, version="2")
    t1_ms = time.time() * 1000
    [b], [a] = before, stats_of(node, "/v2/models/digits/versions/2/stats")
    assert set(a) >= {"name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
                      "batch_stats"}
    assert set(a["inference_stats"]) == STAT_KEYS
    assert a["inference_count"] - b["inference_count"] == n
    assert a["inference_stats"]["success"]["count"] - b["inference_stats"]["success"]["count"] == n
    assert a["inference_stats"]["success"]["ns"] > b["inference_stats"]["success"]["ns"]
    assert a["execution_count"] - b["execution_count"] == n
    assert a["inference_stats"]["compute_infer"]["count"] - b["inference_stats"]["compute_infer"]["count"] == n
    assert a["inference_stats"]["compute_infer"]["ns"] > b["inference_stats"]["compute_infer"]["ns"]
    assert a["inference_stats"]["fail"]["count"] - b["inference_stats"]["fail"]["count"] == 1
    assert t0_ms <= a["last_inference"] <= t1_ms + 1000, (t0_ms, a["last_inference"], t1_ms)
    for never in ("queue", "compute_input", "compute_output", "cache_miss"):
        assert a["inference_stats"][never] == {"count": 0, "ns": 0}, never
    assert a["batch_stats"][0]["batch_size"] == 1 and a["batch_stats"][0]["compute_infer"]["count"] >= n
    # the same counters as a scrape of /metrics (nothing served in between)
    assert a["inference_count"] == scraped(node, "inferbus_model_request_success_total", "digits", "2")
    assert a["execution_count"] == scraped(node, "inferbus_model_runs_total", "digits", "2")
    assert a["inference_stats"]["compute_infer"]["count"] == scraped(node, "inferbus_model_computed_total",
                                                                     "digits", "2")
    assert a["inference_stats"]["fail"]["count"] == scraped(node, "inferbus_model_request_failure_total", "digits",
                                                            "2")


def test_stats_of_every_model_of_one_model_and_404_for_unknown(node):
    every = stats_of(node, "/v2/models/stats")
    served = {(m.name, v) for m in node.client.models().models for v in m.versions}
    assert {(s["name"], s["version"]) for s in every} >= served and ("digits", "1") in served
    assert [s["version"] for s in stats_of(node, "/v2/models/digits/stats")] == ["1", "2"]
    for path, want, text, field in (("/v2/models/no_such_model/stats", 404, "unknown model 'no_such_model'", "model"),
                                    ("/v2/models/digits/versions/9/stats", 404, "has no version '9'", "model_version"),
                                    ("/v2/models/digits/versions/v1/stats", 400, "not a number", None)):
        status, headers, body = ask(node, path)
        assert status == want and text in json.loads(body)["error"], (path, status, body)
        assert headers["inferbus-error-code"] == ("NOT_FOUND" if want == 404 else "INVALID_ARGUMENT")
        if field is not None:  # (as an infer's 404 names it)
            assert headers.get("inferbus-error-field") == field, (path, headers)
    status, headers, _ = ask(node, "/v2/models/stats", "POST")
    assert status == 405 and headers["allow"] == "OPTIONS, GET, HEAD"
    status, _, body = ask(node, "/v2")
    assert json.loads(body)["extensions"] == ["binary_tensor_data", "statistics", "model_repository"]



def test_stats_name_a_process_that_did_not_answer_and_give_the_others_figures(node):
    """The node's worker frozen (SIGSTOP): it cannot answer ``$SRV.STATS`` within the 1 s wait, so the answer is still
    200, its figures those of the ingress alone (the worker's runs left out: ``execution_count`` 0 after a request
    it computed), and ``Inferbus-Stats-Missing`` names the worker. Thawed, the header is gone and its runs count."""
    import os
    import signal

    from conftest import command_lines

    x = np.random.default_rng(int(time.time() * 1000)).random((1, 64), dtype=np.float32)  # (no cache hit)
    node.client.infer("digits", {"pixels": x})
    [pid] = [pid for pid, cmd in command_lines() if "inferbus.actors worker" in cmd and str(node.run_dir) in cmd]
    os.kill(pid, signal.SIGSTOP)
    try:
        status, headers, body = ask(node, "/v2/models/digits/stats")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status == 200 and headers["content-type"] == "application/json", (status, body)
    assert headers.get("inferbus-stats-missing") == "n1-w0", headers
    frozen = json.loads(body)["model_stats"]
    assert [s["version"] for s in frozen] == ["1", "2"], frozen  # (the ingress knows both)
    assert sum(s["inference_count"] for s in frozen) >= 1  # the ingress's counts are there
    assert sum(s["execution_count"] for s in frozen) == 0  # the worker's are not
    deadline = time.monotonic() + 10
    while "inferbus-stats-missing" in (thawed := ask(node, "/v2/models/digits/stats"))[1]:
        assert time.monotonic() < deadline, thawed[1]  # (its reply to a request it read after the wait: left out)
    assert sum(s["execution_count"] for s in json.loads(thawed[2])["model_stats"]) >= 1

@pytest.mark.parametrize("path, status, allow", [
    ("/v2/models/nope/stats", 404, None),
    ("/v2/models/digits/versions/9/stats", 404, None),
    ("/v2/models/a.b/stats", 400, None),
    ("/v2/models/digits/versions/01/stats", 400, None),
    ("/v2/models/nope", 404, None),
    ("/v2/models/nope/ready", 404, None),
    ("/v2/models/nope/infer", 404, None),
    ("/v2/models/digits/versions/9/infer", 404, None),
    ("/v2/repository/models/nope/unload", 404, None),
    ("/v2/repository/models/a.b/load", 400, None),
    ("/v2/models/stats/extra", 404, None),  # (no such path: 404 before too)
    ("/v2/models/digits/stats", 200, "OPTIONS, GET, HEAD"),
    ("/v2/models/digits/versions/2/stats", 200, "OPTIONS, GET, HEAD"),
    ("/v2/models/stats", 200, "OPTIONS, GET, HEAD"),
    ("/v2/models/digits", 200, "OPTIONS, GET, HEAD"),
    ("/v2/models/digits/ready", 200, "OPTIONS, GET, HEAD"),
    ("/v2/models/digits/infer", 200, "OPTIONS, POST"),
    ("/v2/repository/models/digits/unload", 200, "OPTIONS, POST"),
    ("/v2/repository/index", 200, "OPTIONS, POST"),
    ("/v2/health/live", 200, "OPTIONS, GET, HEAD"),
])
def test_options_answers_like_get_for_a_model_or_version_that_does_not_exist(node, path, status, allow):
    """``OPTIONS`` on a path naming a model or version that does not exist is GET's 404 (a name that cannot be one:
    400), with the JSON error and its code; on one that exists, 200 with ``Allow``. Until 2026-12-07 it answered
    200 from the path's shape alone (``/v2/models/nope/stats``: 200 to OPTIONS, 404 to GET)."""
    got, headers, body = ask(node, path, "OPTIONS")
    assert got == status, (path, got, headers, body)
    if allow is None:
        assert "allow" not in headers and headers["inferbus-error-code"] == (
            "NOT_FOUND" if status == 404 else "INVALID_ARGUMENT"), headers
        assert json.loads(body)["error"], body
        if "/repository/" not in path and not path.endswith("/infer"):
            assert ask(node, path)[0] == status  # as GET answers it
    else:
        assert headers["allow"] == allow and body == b"", (headers, body)


def index(node, doc=None) -> list[dict]:
    status, _, body = post_json(node, "/v2/repository/index", doc if doc is not None else {})
    assert status == 200, body
    return json.loads(body)


def test_repository_index_lists_every_version_on_disk_with_its_state(node):
    rows = index(node)
    on_disk = {(p.parent.parent.name, p.parent.name) for p in MODELS.glob("*/*/model.onnx")}
    assert {(r["name"], r["version"]) for r in rows} == on_disk
    assert all(r == {"name": r["name"], "version": r["version"], "state": "READY", "reason": ""} for r in rows), rows
    assert index(node, {"ready": True}) == rows
    status, _, body = ask(node, "/v2/repository/index", "POST", b"")  # tritonclient's: no body at all
    assert status == 200 and json.loads(body) == rows
    for doc, text in (({"ready": "yes"}, "ready must be true or false"), ({"readdy": True}, "unknown field 'readdy'"),
                      ([], "must be a JSON object")):
        status, headers, body = post_json(node, "/v2/repository/index", doc)
        assert status == 400 and text in json.loads(body)["error"], body
        assert headers["inferbus-error-code"] == "INVALID_ARGUMENT"
    status, headers, _ = ask(node, "/v2/repository/index")
    assert status == 405 and headers["allow"] == "OPTIONS, POST"


def write(node, op: str, model: str, doc=None):
    status, headers, body = post_json(node, f"/v2/repository/models/{model}/{op}", doc if doc is not None else {})
    return status, headers, json.loads(body)


def test_unload_withdraws_the_whole_model_default_last_and_load_serves_it_again(node, tmp_path):
    """Triton's model-level unload: every version but the default (digits: 2), then the default (1): the model is
    withdrawn (NOT_FOUND over NATS, UNAVAILABLE "unloaded" in the index); again: nothing to do, 200; load: every
    version on disk again, default as config.json says."""
    status, _, doc = write(node, "unload", "digits")
    assert status == 200, doc
    assert [(w["op"], w["version"], w["changed"]) for w in doc["writes"]] == [("unload", "2", True),
                                                                              ("unload", "1", True)]
    assert doc["versions"] == []
    with pytest.raises(NotFound):
        node.client.model("digits")
    assert [r for r in index(node) if r["name"] == "digits"] == [
        {"name": "digits", "version": v, "state": "UNAVAILABLE", "reason": "unloaded"} for v in ("1", "2")]
    assert all(r["name"] != "digits" for r in index(node, {"ready": True}))
    status, _, doc = write(node, "unload", "digits")
    assert status == 200 and doc["writes"] == [], doc
    status, _, doc = write(node, "load", "digits")
    assert status == 200 and doc["versions"] == ["1", "2"] and doc["default_version"] == "1", doc
    meta = node.client.model("digits")
    assert meta.versions == ["1", "2"] and meta.parameters["default_version"] == "1"
    node.client.infer("digits", {"pixels": np.zeros((1, 64), np.float32)})
    # the model list stays in name order, as the index is (a fresh-user trial: digits came last once loaded again)
    names = [m.name for m in node.client.models().models]
    assert names == sorted(names) and "digits" in names and len(names) > 1, names


def test_parameters_version_and_refusals(node):
    """``parameters.version`` writes that version alone (inferbus's rule: the default is refused while others are
    served); Triton's ``config`` and ``file:`` parameters and unknown ones are 400 naming them; a model neither
    served nor on disk is 404."""
    status, headers, doc = write(node, "unload", "digits", {"parameters": {"version": 1}})  # the default
    assert status == 400 and headers["inferbus-error-code"] == "INVALID_ARGUMENT", doc
    assert "default" in doc["error"], doc
    status, _, doc = write(node, "unload", "digits", {"parameters": {"version": "2", "unload_dependents": False}})
    assert status == 200 and doc["versions"] == ["1"], doc
    assert [(w["op"], w["version"]) for w in doc["writes"]] == [("unload", "2")]
    status, _, doc = write(node, "load", "digits", {"parameters": {"version": 2}})
    assert status == 200 and doc["versions"] == ["1", "2"], doc
    for op, params, text in (("load", {"config": "{}"}, "parameter 'config' is not supported"),
                             ("load", {"file:1/model.onnx": "AAAA"}, "parameter 'file:1/model.onnx' is not supported"),
                             ("load", {"unload_dependents": True}, "unknown parameter 'unload_dependents'"),
                             ("unload", {"force": True}, "unknown parameter 'force'"),
                             ("unload", {"unload_dependents": "yes"}, "unload_dependents must be true or false"),
                             ("load", {"version": "v2"}, "not a number")):
        status, headers, doc = write(node, op, "digits", {"parameters": params})
        assert status == 400 and text in doc["error"], (op, params, doc)
        assert headers["inferbus-error-code"] == "INVALID_ARGUMENT"
    status, headers, doc = write(node, "unload", "no_such_model")
    assert status == 404 and headers["inferbus-error-code"] == "NOT_FOUND", doc
    status, _, doc = write(node, "load", "no_such_model")
    assert status == 404, doc
    assert node.client.model("digits").versions == ["1", "2"]


@pytest.mark.parametrize("op, version, status, text", [
    ("load", "x", 400, 'parameters.version "x" is not a number'),
    ("unload", "x", 400, 'parameters.version "x" is not a number'),
    ("load", -1, 400, "parameters.version -1 is not a number"),
    ("load", "+1", 400, 'parameters.version "+1" is not a number'),
    ("load", True, 400, "got true"),
    ("unload", False, 400, "got false"),
    ("load", 1.0, 400, "got 1.0"),
    ("load", None, 400, "got null"),
    ("load", [2], 400, "got [2]"),
    ("load", "01", 400, 'parameters.version "01" has a leading zero: write it "1"'),
    ("load", "99999999999999999999", 400, "is over the largest version"),
    ("load", "9", 404, "'9'"),  # (a version number, not on disk)
    ("unload", 1, 400, "default"),  # (the default, while the model serves 2 too)
])
def test_every_refusal_of_parameters_version_names_that_field(node, op, version, status, text):
    """Whatever is wrong with a load's or unload's ``parameters.version``, ``Inferbus-Error-Field`` is
    ``parameters.version``, what the HTTP client sent (the NATS write's own field is ``version``, docs/models.md;
    the SDK's ``model_version``), and the message spells the value as JSON. A fresh-user trial read three names:
    ``model_version`` for ``"x"`` or ``-1``, ``parameters.version`` for ``true`` or ``1.0`` (``got True``), ``version``
    for ``"9"``."""
    status_got, headers, doc = write(node, op, "digits", {"parameters": {"version": version}})
    assert status_got == status, (op, version, status_got, headers, doc)
    assert headers.get("inferbus-error-field") == "parameters.version", (op, version, headers, doc)
    assert text in doc["error"], (op, version, doc)
    assert not re.search(r"\b(True|False|None)\b", doc["error"]), doc  # (Python's spellings)
    assert node.client.model("digits").versions == ["1", "2"]


def test_a_refusal_of_unload_dependents_spells_the_value_as_json(node):
    status, headers, doc = write(node, "unload", "digits", {"parameters": {"unload_dependents": None}})
    assert status == 400 and headers.get("inferbus-error-field") == "parameters.unload_dependents", (headers, doc)
    assert doc["error"] == "parameters.unload_dependents must be true or false, got null", doc


@pytest.mark.parametrize("depth", [1100, 3000])
def test_a_repository_body_nested_too_deeply_is_the_ingress_400_not_a_500(node, depth):
    """An index, load or unload body with ``parameters.version`` nested past the decoder's bound: 400
    INVALID_ARGUMENT with the message the ingress gives such a JSON request over NATS, the connection kept, no
    traceback in the logs. Until 2026-12-07 ``json.loads`` raised RecursionError: 500 and a traceback in ``up``'s
    output and node.log per request, on the index path with no flag (a fresh-user trial: any client could flood the
    logs)."""
    from inferbus.schemas import InvalidArgument

    body = deep_json({"parameters": {"version": "@"}}, depth)
    with pytest.raises(InvalidArgument) as over_nats:  # (an infer's data so nested: the ingress's refusal)
        node.client.request("hx.infer.digits", deep_json({"inputs": [{"name": "pixels", "datatype": "FP32",
                                                                      "shape": [1, 64], "data": "@"}]}, depth),
                            timeout_s=5.0, content_type="application/json")
    assert over_nats.value.message.startswith("the request body is nested too deeply to decode"), over_nats.value
    for path in ("/v2/repository/index", "/v2/repository/models/digits/load", "/v2/repository/models/digits/unload"):
        status, headers, got = ask(node, path, "POST", body, {"Content-Type": "application/json"})
        assert status == 400 and headers["inferbus-error-code"] == "INVALID_ARGUMENT", (path, status, got[:500])
        assert json.loads(got) == {"error": over_nats.value.message}, path
        assert headers.get("connection") != "close", (path, headers)
    assert node.client.model("digits").versions == ["1", "2"]
    no_traceback_in_the_logs(node)


def test_a_version_specific_unload_is_idempotent_and_404_only_for_a_model_not_known(node):
    """``parameters.version`` twice: the second is 200 with nothing written (the version is not served), as a
    whole-model unload repeated is; until 2026-12-07 it was 404. The model withdrawn, a version of it (on this
    node's disk) is 200 too; a model neither served nor on disk stays 404."""
    status, _, doc = write(node, "unload", "digits", {"parameters": {"version": "2"}})
    assert status == 200 and doc["versions"] == ["1"], doc
    assert [(w["op"], w["version"], w["changed"]) for w in doc["writes"]] == [("unload", "2", True)]
    status, headers, doc = write(node, "unload", "digits", {"parameters": {"version": "2"}})
    assert status == 200, (headers, doc)
    assert doc == {"name": "digits", "versions": ["1"], "default_version": "1", "revision": None, "writes": []}
    assert node.client.model("digits").versions == ["1"]
    status, _, doc = write(node, "unload", "digits")  # the whole model: withdrawn
    assert status == 200 and doc["versions"] == [], doc
    for version in ("1", "2"):
        status, _, doc = write(node, "unload", "digits", {"parameters": {"version": version}})
        assert status == 200, doc
        assert doc == {"name": "digits", "versions": [], "default_version": "", "revision": None, "writes": []}
    status, headers, doc = write(node, "unload", "no_such_model", {"parameters": {"version": "1"}})
    assert status == 404 and headers["inferbus-error-code"] == "NOT_FOUND", doc
    assert headers.get("inferbus-error-field") == "model" and "unknown model 'no_such_model'" in doc["error"], doc
    status, _, doc = write(node, "load", "digits")
    assert status == 200 and doc["versions"] == ["1", "2"], doc
    assert node.client.model("digits").versions == ["1", "2"]


def test_an_error_over_http_does_not_tell_the_model_repositorys_absolute_path(node):
    """The HTTP port has no authentication: a load of a model with no folder said ``... with a config.json under
    /abs/path/models`` (a fresh-user trial); it names the repository in words, the folder relative to it."""
    import os

    from conftest import MODELS

    status, headers, doc = write(node, "load", "nope")
    assert status == 404 and headers["inferbus-error-code"] == "NOT_FOUND", doc
    assert "'nope'" in doc["error"] and "the node's model repository (--models)" in doc["error"], doc
    for root in {os.path.abspath(MODELS), os.path.realpath(MODELS)}:
        assert root not in doc["error"], doc


COUNTERS = ("inferbus_model_request_success_total", "inferbus_forward_latency_seconds_count",
            "inferbus_forward_latency_seconds_sum", "inferbus_model_runs_total", "inferbus_model_computed_total")


def version_counts(node, version: str) -> dict[str, float]:
    """digits ``version``'s counters on ``/metrics`` and its figures in the statistics extension, one dict."""
    [st] = stats_of(node, f"/v2/models/digits/versions/{version}/stats")
    got = {family: scraped(node, family, "digits", version) for family in COUNTERS}
    got.update(inference_count=st["inference_count"], execution_count=st["execution_count"],
               success_ns=st["inference_stats"]["success"]["ns"], last_inference=st["last_inference"],
               compute_infer=st["inference_stats"]["compute_infer"]["count"])
    return got


def settled_counts(node, version: str, inferences: int) -> dict[str, float]:
    """:func:`version_counts` once it counts ``inferences`` inferences at least and two reads in a row agree: an
    ingress counts a request just after its answer is sent, so a read right after the client got it can miss it (a
    clean-clone CI run read ``inference_count`` 2 of 3, and 3 a moment later)."""
    deadline = time.monotonic() + 10
    last = None
    while True:
        got = version_counts(node, version)
        if got == last and got["inference_count"] >= inferences:
            return got
        assert time.monotonic() < deadline, (last, got)
        last = got
        time.sleep(0.05)


def test_a_versions_counts_survive_its_unload_and_grow_from_there_once_loaded_again(node):
    """Counters are monotonic for the life of the process (Prometheus's semantics: ``rate()`` reads a drop as a
    restart): N requests to digits v2, then v2 unloaded (``parameters.version``): every counter of v2 on ``/metrics``
    and every figure of its statistics is what it was, none less (a fresh-user trial: ``request_success_total`` 7 →
    2, ``forward_latency_seconds_count`` 5 → 0, ``last_inference`` → 0); loaded again, M more requests: up by M."""
    rng = np.random.default_rng(11)
    n, m = 3, 2
    for _ in range(n):
        node.client.infer("digits", {"pixels": rng.random((1, 64), dtype=np.float32)}, version="2")
    served = settled_counts(node, "2", n)
    assert served["inferbus_forward_latency_seconds_count"] >= n and served["last_inference"] > 0, served
    assert served["inferbus_model_runs_total"] >= n, served
    status, _, doc = write(node, "unload", "digits", {"parameters": {"version": "2"}})
    assert status == 200 and doc["versions"] == ["1"], doc
    unloaded = version_counts(node, "2")
    assert unloaded == served, {k: (served[k], unloaded[k]) for k in served if unloaded[k] != served[k]}
    status, _, doc = write(node, "load", "digits", {"parameters": {"version": "2"}})
    assert status == 200 and doc["versions"] == ["1", "2"], doc
    assert version_counts(node, "2") == served
    for _ in range(m):
        node.client.infer("digits", {"pixels": rng.random((1, 64), dtype=np.float32)}, version="2")
    again = settled_counts(node, "2", served["inference_count"] + m)
    for key in ("inferbus_model_request_success_total", "inferbus_forward_latency_seconds_count", "inference_count",
                "inferbus_model_runs_total", "inferbus_model_computed_total", "execution_count", "compute_infer"):
        assert again[key] == served[key] + m, (key, served[key], again[key])
    for key in ("inferbus_forward_latency_seconds_sum", "success_ns", "last_inference"):
        assert again[key] > served[key], (key, served[key], again[key])


def test_tritonclient_statistics_index_load_and_unload(node):
    """Triton's own HTTP client (``pip install tritonclient[http]``) against these paths."""
    th = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed (an optional check: "
                                                         "pip install -e '.[triton]')")
    client = th.InferenceServerClient(node.http_address, connection_timeout=10, network_timeout=30)
    try:
        st = client.get_inference_statistics("digits", "2")
        assert [(s["name"], s["version"]) for s in st["model_stats"]] == [("digits", "2")]
        assert len(client.get_inference_statistics()["model_stats"]) >= 3
        assert {"name": "fraud", "version": "1", "state": "READY", "reason": ""} in client.get_model_repository_index()
        client.unload_model("fraud")
        assert not client.is_model_ready("fraud")
        assert {"name": "fraud", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in \
            client.get_model_repository_index()
        client.load_model("fraud")
        assert client.is_model_ready("fraud")
    finally:
        client.close()


def concurrently(node, writes) -> list[tuple[str, int, dict]]:
    """``(op, status, doc)`` of ``writes`` (``(op, model)`` pairs), each sent at once on its own thread and
    connection."""
    results: list = [None] * len(writes)
    go = threading.Barrier(len(writes))

    def one(i, op, model):
        go.wait(5)
        status, _, doc = write(node, op, model)
        results[i] = (op, status, doc)

    threads = [threading.Thread(target=one, args=(i, op, model)) for i, (op, model) in enumerate(writes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in results), results
    return results


def test_whole_model_unloads_racing_each_other_or_loads_are_idempotent(node):
    """Six whole-model unloads of digits at once: every one 200 (a version another unload took meanwhile counts as
    done; the old code answered 404 to five of them) and the model withdrawn; six unloads racing six loads: never a
    400 about a version the caller did not name nor a 404, each unload 200 or a retryable 503 (the default's unload
    refused because loads served other versions meanwhile, round after round); then a load serves digits again."""
    for op, status, doc in concurrently(node, [("unload", "digits")] * 6):
        assert status == 200, doc
    with pytest.raises(NotFound):
        node.client.model("digits")
    for op, status, doc in concurrently(node, [("unload", "digits"), ("load", "digits")] * 6):
        if op == "load":
            assert status == 200, doc
        else:
            assert status in (200, 503), doc
            assert status == 200 or "retry" in doc["error"], doc
    status, _, doc = write(node, "load", "digits")
    assert status == 200 and doc["versions"] == ["1", "2"], doc
    assert node.client.model("digits").versions == ["1", "2"]
    node.client.infer("digits", {"pixels": np.zeros((1, 64), np.float32)})


def test_a_write_where_writes_are_refused_is_the_nats_answer_unavailable_naming_the_primary(node):
    """A region manager of region A announces itself primary (the test publishes its heartbeats, as
    tests/test_models_control.py does): this node's ingress (in no region) refuses writes, UNAVAILABLE naming the
    primary, which the HTTP answer is: 503, ``Inferbus-Error-Code: UNAVAILABLE``, ``Retry-After``, nothing changed.
    The ingress keeps refusing for 60 s after the last heartbeat: this test runs last."""
    import asyncio

    from inferbus.bus import Subjects
    from inferbus.schemas._region import PRIMARY, RegionHeartbeat, encode_region

    stop = threading.Event()

    def heartbeats():
        async def go():
            import nats

            nc = await nats.connect(node.nats_url)
            seq = 0
            while not stop.is_set():
                seq += 1
                hb = RegionHeartbeat(region="A", role=PRIMARY, term=0, lease_rev=7, seq=seq, manager_id="A-test",
                                     lease_holder="A", model_writes=True)
                await nc.publish(Subjects(node.prefix).region_heartbeat("A"), encode_region(hb))
                await asyncio.sleep(0.05)
            await nc.close()

        asyncio.run(go())

    t = threading.Thread(target=heartbeats, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            # (a load of a served version: nothing to do where writes are accepted, the gate's answer where not)
            status, headers, doc = write(node, "load", "digits", {"parameters": {"version": "1"}})
            if status != 200:
                break
            assert time.monotonic() < deadline, "writes still accepted"
            time.sleep(0.05)
        assert status == 503 and headers["inferbus-error-code"] == "UNAVAILABLE", doc
        assert "primary region (A)" in doc["error"] and re.fullmatch(r"\d+", headers["retry-after"]), (doc, headers)
        for params in ({}, {"version": "2"}):  # the whole model (the first write refused) and one version
            status, headers, doc = write(node, "unload", "digits", {"parameters": params})
            assert status == 503 and headers["inferbus-error-code"] == "UNAVAILABLE", doc
            assert "primary region (A)" in doc["error"], doc
        assert node.client.model("digits").versions == ["1", "2"]
    finally:
        stop.set()
        t.join(5)

