"""bench.ab: the working tree against a git revision, alternated suite runs, one comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ab import compare, extract
from inferbus._cpus import cores_text

ROOT = Path(__file__).resolve().parents[1]


def _doc(p50: float, qps: float, cpu: float, extra_rate: float) -> dict:
    return {"steps": [
        {"target": "echo", "mode": "closed", "concurrency": 1, "p50_us": 200, "p99_us": 400, "qps": 4000,
         "cpu_us_per_req": {"echo": 50, "ingress": 3}, "wrong": 0},
        {"target": "inferbus", "label": "inferbus miss", "mode": "closed", "concurrency": 1, "p50_us": p50,
         "p99_us": 2 * p50, "qps": qps, "cpu_us_per_req": {"colocated": cpu, "nats-server": 99}, "wrong": 0},
        # a sweep's bisection step: its rate differs between runs, so it is not compared
        {"target": "inferbus", "label": "inferbus miss", "mode": "open", "rate_qps": extra_rate, "p50_us": 1,
         "p99_us": 1, "qps": 1, "wrong": 0},
    ], "ratios": {"throughput": {"inferbus_over_echo": 0.25}}}


def test_compare_takes_medians_counts_pairs_and_skips_unmatched_steps():
    base = [_doc(700, 1400, 400, 1000.0), _doc(900, 1100, 500, 1100.0), _doc(800, 1300, 450, 1200.0)]
    work = [_doc(600, 1500, 380, 1300.0), _doc(950, 1000, 520, 1400.0), _doc(700, 1350, 430, 1500.0)]
    doc = compare(base, work)
    assert doc["pairs"] == 3
    assert [r["step"] for r in doc["rows"]] == ["echo, closed c=1", "inferbus miss, closed c=1"]
    miss = doc["rows"][1]
    assert miss["base"] == {"p50_us": 800, "p99_us": 1600, "qps": 1300, "actor_cpu_us_per_req": 450}
    assert miss["work"] == {"p50_us": 700, "p99_us": 1400, "qps": 1350, "actor_cpu_us_per_req": 430}
    assert miss["work_lower_p50_pairs"] == 2 and miss["work_higher_qps_pairs"] == 2
    assert doc["rows"][0]["base"]["actor_cpu_us_per_req"] is None  # not for the echo's steps
    assert doc["throughput"]["work"] == [{"inferbus_over_echo": 0.25}] * 3
    with pytest.raises(ValueError):
        compare(base, work[:2])


def test_ab_runs_both_trees_alternated_against_real_processes(tmp_path):
    """One pair of tiny suite runs: HEAD's tree from git archive, and the working tree; each run imports its own
    tree's code, every answer right, and the comparison covers the closed-loop steps."""
    out = tmp_path / "runs" / "ab"  # not there yet: bench.ab makes it
    tree = tmp_path / "tree"  # the base as a lent host gets it: a directory, no git (--base-tree)
    head = extract("HEAD", tree)
    core = min(os.sched_getaffinity(0))  # the work side's nats-server runs there alone
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base-tree", str(tree), "--pairs", "1", "--out",
                           str(out), "--first", "work", "--work-args", f"--nats-cpus {core}", "--", "--profile",
                           "tiny", "--closed", "1", "--no-sweep", "--open-rates", "200", "--no-l2", "--duration", "0.3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.index("[work-1]") < proc.stdout.index("[base-1]")  # --first work
    doc = json.loads((out / "ab.json").read_text())
    assert len(head) == 40 and doc["base_commit"] == f"tree:{tree.resolve()}"
    assert doc["pairs"] == 1 and doc["compared_pairs"] == [1] and not doc["failed_runs"]
    assert doc["imported_from"]["base"] == str((tree / "inferbus" / "__init__.py").resolve())
    assert doc["imported_from"]["work"] == str(ROOT / "inferbus" / "__init__.py")
    assert (tree / "models" / "digits").is_dir()
    steps = {r["step"]: r for r in doc["rows"]}
    miss = steps["inferbus miss, closed c=1"]
    assert miss["base"]["qps"] > 0 and miss["work"]["qps"] > 0 and miss["base"]["actor_cpu_us_per_req"] > 0
    assert all(r["wrong"] == 0 for r in doc["rows"])
    assert (out / "base-1.json").exists() and (out / "work-1.json").exists()
    assert "working tree, medians of 1 pair(s)" in proc.stdout
    # --work-args: the working tree's run alone kept nats-server on one core (its affinity as the suite read it back)
    assert doc["work_args"] == ["--nats-cpus", str(core)]
    assert "[work-1] python -m bench.suite --profile tiny" in proc.stdout
    work, base = (json.loads((out / f"{side}-1.json").read_text())["meta"] for side in ("work", "base"))
    assert work["config"]["nats_cpus"] == [core] and work["nats_affinity"] == str(core)
    assert "nats_cpus" not in base["config"] or base["config"]["nats_cpus"] is None
    assert f"note: nats-server ran on core {core} for the echo too" in " ".join((out / "work-1.log").read_text().split())
    assert "note: nats-server ran on" not in (out / "base-1.log").read_text()
    assert base["nats_affinity"] == cores_text(os.sched_getaffinity(0))  # unpinned: this process's own cores


def test_ab_refuses_an_unknown_revision_and_suite_output_flags(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", "no-such-rev-xyz", "--out", str(tmp_path / "x")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no commit" in proc.stderr
    assert not (tmp_path / "x").exists()  # nothing left behind
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", "HEAD", "--out", str(tmp_path), "--",
                           "--json", "x.json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--json/--png are set by bench.ab" in proc.stderr


@pytest.mark.parametrize("suite_args,said", [
    (["--workers", "0"], "argument --workers: must be an integer >= 1, got 0"),
    (["--closed", "1,x"], "argument --closed: an integer expected, got 'x'"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["--profile", "huge"], "argument --profile: invalid choice: 'huge'"),
    (["--nats-cpus", "1-0"], "argument --nats-cpus: must be a CPU list whose ranges run from a core to a later one, "
                             "got '1-0'"),
    (["--nats-cpus", "0-x"], "argument --nats-cpus: must be a CPU list (e.g. 11-15 or 0,2,8-11), got '0-x'"),
    (["--nats-cpus", "100000"], "argument --nats-cpus: must be cores this process may run on "),
])
def test_ab_refuses_bad_suite_arguments_up_front_exit_2(tmp_path, suite_args, said):
    """Bad suite arguments after ``--`` are bench.ab's usage error (status 2) naming the argument, before the base
    is extracted or any run starts; they used to fail every run (each suite's exit 2 only in its log), end in
    status 1 and leave ``--out`` behind with the extracted tree and the logs."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", "HEAD", "--pairs", "1", "--out", str(out), "--",
                           *suite_args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"python -m bench.ab: error: bench.suite arguments (after --): {said}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "[base-1]" not in proc.stdout and "[work-1]" not in proc.stdout  # no suite run started
    assert not out.exists()  # nothing left behind


def test_ab_refuses_a_revision_without_the_suite_and_an_out_that_is_a_file(tmp_path):
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True).stdout.split()[0]  # the repository's first commit: no bench/ yet
    has_bench = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", first, "bench"], capture_output=True,
                               text=True).stdout.strip()
    if not has_bench:
        proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", first, "--out", str(tmp_path / "o")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "bench.ab needs a revision with the suite" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    afile = tmp_path / "file"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", "HEAD", "--out", str(afile)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: --out {afile}: exists and is not a folder; give a folder (made if missing)"], proc.stderr


@pytest.mark.parametrize("out, make, said", [
    ("{tmp}/file/out", "file", "error: --out {tmp}/file/out: {tmp}/file is not a folder"),
    ("{tmp}/o", "ab.json", "error: --out {tmp}/o: cannot write {tmp}/o/ab.json: is a folder"),
    ("{tmp}/o", "work-2.log", "error: --out {tmp}/o: cannot write {tmp}/o/work-2.log: is a folder"),
    ("{tmp}/o", "base-tree", "error: --out {tmp}/o: {tmp}/o/base-tree, where the base is extracted, is a file"),
])
def test_ab_refuses_an_out_the_runs_cannot_write_in_before_any_run(tmp_path, out, make, said):
    """``ab.json`` was written only after every run (a folder in its place a traceback then, the comparison lost);
    an ``--out`` under a file failed at the extraction with a traceback. Now: one line naming ``--out``, exit 2,
    before the base is extracted or any suite runs."""
    out = Path(out.format(tmp=tmp_path))
    if make == "file":
        (tmp_path / "file").write_text("x")
    elif make == "base-tree":
        out.mkdir()
        (out / make).write_text("x")
    else:
        (out / make).mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", "HEAD", "--pairs", "2", "--out", str(out),
                           "--", "--profile", "tiny"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [said.format(tmp=tmp_path)], proc.stderr
    assert "[base-1]" not in proc.stdout and "[work-1]" not in proc.stdout  # no suite run started
    assert sorted(tmp_path.rglob("*")) == before  # nothing extracted, nothing made


def test_ab_base_tree_must_hold_the_three_folders_and_excludes_base(tmp_path):
    """``--base-tree`` (a host without the repository): a directory lacking ``bench/`` (or the others) is refused
    at once naming what is missing, and it cannot be combined with ``--base``."""
    tree = tmp_path / "tree"
    (tree / "inferbus").mkdir(parents=True)
    (tree / "models").mkdir()
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base-tree", str(tree), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "has no bench/" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "bench.ab", "--base", "HEAD", "--base-tree", str(tree), "--out",
                           str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not allowed with" in proc.stderr, proc.stderr


def test_work_args_take_a_single_flag_and_refuse_an_empty_or_bad_one(capsys):
    """``--work-args --colocate`` was argparse's "expected one argument" (a value starting with "-"); an empty one
    ran two identical sides; a bad suite option in it is a usage error naming --work-args, before any run."""
    from bench.ab import _parse

    for given, split in ((["--work-args", "--colocate"], ["--colocate"]), (["--work-args=--no-l2 --pin"],
                                                                          ["--no-l2", "--pin"])):
        a, suite_args = _parse(["--base-tree", str(ROOT), "--out", "/tmp/x", *given, "--", "--profile", "tiny"])
        assert a.work_args == split and suite_args == ["--profile", "tiny"]
    for given, said in (("", "--work-args is empty"), ("--bogus", "--work-args with the arguments after --: "
                                                                  "unrecognized arguments: --bogus"),
                        ("'--pin", "--work-args: No closing quotation")):
        with pytest.raises(SystemExit) as ei:
            _parse(["--base-tree", str(ROOT), "--out", "/tmp/x", "--work-args", given, "--", "--profile", "tiny"])
        assert ei.value.code == 2 and said in capsys.readouterr().err
