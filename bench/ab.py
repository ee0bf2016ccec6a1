"""A/B of the working tree against a git revision: alternated suite runs, one comparison table.

    python -m bench.ab --base c330915 --pairs 2 --out bench/results/<name> -- \\
        --profile quick --no-ray --colocate --workers 1 --no-l2 --no-sweep --closed 1,32 --open-rates 1000

``inferbus/``, ``bench/`` and ``models/`` of the base revision are extracted with ``git archive`` into
``<out>/base-tree``. Each pair runs ``python -m bench.suite <suite args>`` once with that tree first on
``PYTHONPATH`` (every process the suite starts imports the base's code; checked before the first run) and once
with the working tree, base first in odd pairs and working tree first in even pairs (``--first work`` swaps them), so that the drift of a
shared host falls on both sides. The JSON of every run is kept (``<out>/base-N.json``, ``<out>/work-N.json``).

The comparison (``<out>/ab.json`` and a table on stdout): for every step that every run has (same series,
mode and concurrency or rate; the bisection steps of a sweep differ between runs and are left out), the median
over the pairs of p50, p99, answers/s and the actors' CPU µs per request (the ``colocated``, ``ingress`` and
``worker`` groups of the suite's ``cpu_us_per_req``), and in how many pairs the working tree had the lower p50
and the higher answers/s; then each run's sweep ratios (``ratios.throughput``) when sweeps ran. On a shared box
only these ratios mean something, not the absolute times (DESIGN §11); pairs that disagree are the run-to-run
spread, and a change whose pairs split is not shown to help.

``--work-args "ARGS"`` adds suite arguments to the working tree's runs only; with ``--base-tree .`` (the working
tree as its own base) that is an alternated A/B of a setting on the same code, e.g. ``--work-args "--nats-cpus
11-15"``.

Where the repository is not at hand (a lent benchmark host gets a copy of the working tree without ``.git``),
``--base-tree DIR`` takes the base from a directory that holds those three folders already (made beforehand
with ``git archive <rev> inferbus bench models | tar -x -C DIR``); ``ab.json`` then names the directory instead
of a commit.

Exit status: 0; 1 when a run failed or any answer was wrong (or ``ab.json`` could not be written after all); 2 for
an unknown revision or bad arguments, those after ``--`` included: they are parsed with the suite's own parser before
anything is extracted or run. An ``--out`` the runs cannot write in (a file; under a file; a folder that is not
writable; a file it will write, ``ab.json`` or a run's JSON or log, that is a folder) is refused then too, with one
line ``error: --out ...`` on stderr (:func:`out_problem`), not found after the runs, their results lost.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from inferbus._paths import folder_problem, output_file_problem

from . import _args as args

ROOT = Path(__file__).resolve().parents[1]
ACTOR_GROUPS = ("colocated", "ingress", "worker")
_TREE_PATHS = ("inferbus", "bench", "models")


def extract(rev: str, dest: Path) -> str:
    """Write ``inferbus/``, ``bench/`` and ``models/`` of ``rev`` under ``dest``; return the full commit id.

    Raises:
        ValueError: ``rev`` names no commit of this repository, or that commit lacks one of those folders.
        subprocess.CalledProcessError: ``git archive`` or ``tar`` failed.
    """
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"--base {rev!r} names no commit of {ROOT}")
    commit = found.stdout.strip()
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", commit, *_TREE_PATHS],
                            capture_output=True, text=True).stdout.split()
    missing = [p for p in _TREE_PATHS if p not in listed]
    if missing:
        raise ValueError(f"--base {rev!r} ({commit[:10]}) has no {', '.join(f'{p}/' for p in missing)}: "
                         "bench.ab needs a revision with the suite (bench/suite.py)")
    if dest.exists():  # a tree from an earlier run of another revision must not leave files behind
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", commit, *_TREE_PATHS],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise subprocess.CalledProcessError(archive.returncode, "git archive")
    return commit


def _env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def imported_from(tree: Path) -> str:
    """Where ``import inferbus`` resolves with ``tree`` first on PYTHONPATH (the check that a run uses ``tree``)."""
    out = subprocess.run([sys.executable, "-c", "import inferbus; print(inferbus.__file__)"], cwd=tree,
                         env=_env(tree), capture_output=True, text=True, check=True)
    return out.stdout.strip()


def step_key(step: dict) -> tuple:
    load = step.get("concurrency") if step.get("mode") == "closed" else step.get("rate_qps")
    return (step.get("label") or step.get("target"), step.get("mode"), load)


def actor_cpu_us(step: dict) -> float | None:
    """The actors' CPU µs per request of a suite step (None for the echo's steps: the idle actors' CPU divided by
    the echo's requests says nothing)."""
    if step.get("target") == "echo":
        return None
    cpu = step.get("cpu_us_per_req") or {}
    total = sum(cpu.get(g) or 0.0 for g in ACTOR_GROUPS)
    return total or None


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def compare(base: list[dict], work: list[dict]) -> dict:
    """The comparison of pairs of suite documents (``base[i]`` against ``work[i]``); see the module docstring.

    Raises:
        ValueError: the lists are empty or of different lengths.
    """
    if not base or len(base) != len(work):
        raise ValueError(f"need pairs of runs, got {len(base)} base and {len(work)} working-tree runs")
    docs = base + work
    indexed = [{step_key(s): s for s in d.get("steps", [])} for d in docs]
    keys = [step_key(s) for s in base[0].get("steps", []) if all(step_key(s) in ix for ix in indexed)]
    rows = []
    for key in dict.fromkeys(keys):
        b = [indexed[i][key] for i in range(len(base))]
        w = [indexed[len(base) + i][key] for i in range(len(work))]
        side = {}
        for name, steps in (("base", b), ("work", w)):
            side[name] = {"p50_us": _median([s.get("p50_us") for s in steps]),
                          "p99_us": _median([s.get("p99_us") for s in steps]),
                          "qps": _median([s.get("qps") for s in steps]),
                          "actor_cpu_us_per_req": _median([actor_cpu_us(s) for s in steps])}
        series, mode, load = key
        rows.append({
            "step": f"{series}, {mode} " + (f"c={load}" if mode == "closed" else f"{load:g}/s"),
            **side,
            "work_lower_p50_pairs": sum(wi["p50_us"] < bi["p50_us"] for bi, wi in zip(b, w)),
            "work_higher_qps_pairs": sum(wi["qps"] > bi["qps"] for bi, wi in zip(b, w)),
            "wrong": sum(s.get("wrong", 0) for s in b + w),
        })
    throughput = {name: [(d.get("ratios") or {}).get("throughput") for d in ds] for name, ds in (("base", base),
                                                                                                 ("work", work))}
    return {"pairs": len(base), "rows": rows, "throughput": throughput}


def render(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    def cell(row, field, digits=0):
        b, w = row["base"][field], row["work"][field]
        return "—" if b is None or w is None else f"{b:,.{digits}f} → {w:,.{digits}f}"

    base = doc["base_commit"]
    t = Table(title=f"base {base if base.startswith('tree:') else base[:10]} → working tree, medians of "
                    f"{doc['pairs']} pair(s)")
    for col in ("step", "p50 µs", "p99 µs", "answers/s", "actor CPU µs/req", "work: lower p50 / more answers"):
        t.add_column(col, justify="left" if col == "step" else "right")
    for r in doc["rows"]:
        t.add_row(r["step"], cell(r, "p50_us"), cell(r, "p99_us"), cell(r, "qps"), cell(r, "actor_cpu_us_per_req"),
                  f"{r['work_lower_p50_pairs']} / {r['work_higher_qps_pairs']} of {doc['pairs']}")
    console = Console(width=max(Console().width, 150))
    console.print(t)
    for name in ("base", "work"):
        for i, tp in enumerate(doc["throughput"][name], 1):
            if tp and any(v is not None for v in tp.values()):
                console.print(f"{name}-{i} sweeps: " + ", ".join(f"{k}={v}" for k, v in tp.items()))


def _check_suite_args(p: argparse.ArgumentParser, suite_args: list[str],
                      where: str = "bench.suite arguments (after --)") -> None:
    """Parse ``suite_args`` with the working tree's suite parser before any work: a bad one is ``p``'s usage error
    (status 2), not a failed run per side (each suite run's exit 2 went to its log only) and a run directory.
    ``-- --help`` prints the suite's options."""
    from . import suite

    sp = suite._parser()
    sp.error = lambda message: p.error(f"{where}: {message}")  # type: ignore[method-assign]
    try:
        suite.config_from(sp.parse_args(suite_args))
    except ValueError as exc:
        p.error(f"{where}: {exc}")


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    suite_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, suite_args = argv[:cut], argv[cut + 1:]
    # `--work-args --colocate`: argparse takes a value that starts with "-" and holds no space for an option of its
    # own ("expected one argument"); the value after --work-args is always its value
    argv = [f"--work-args={argv[i + 1]}" if x == "--work-args" and i + 1 < len(argv) else x
            for i, x in enumerate(argv) if not (i > 0 and argv[i - 1] == "--work-args")]
    p = argparse.ArgumentParser(prog="python -m bench.ab",
                                usage="python -m bench.ab (--base REV | --base-tree DIR) [--pairs N] [--first base|work] [--work-args ARGS] --out DIR -- "
                                      "[bench.suite arguments]",
                                description=__doc__.split("\n\n")[0],
                                epilog="Everything after -- goes to each `python -m bench.suite` run (not "
                                       "--json/--png). Exit status: 0; 1 when a run failed or an answer was wrong; "
                                       "2 for an unknown revision, bad arguments (the suite's are checked before any "
                                       "run; -- --help lists them) or an --out the runs cannot write in. "
                                       "docs/performance.md, 'Running it', says more.")
    base = p.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", help="the git revision to compare the working tree against")
    base.add_argument("--base-tree", type=Path, help="a directory holding the base's inferbus/, bench/ and "
                      "models/ (instead of --base, where there is no git repository)")
    p.add_argument("--pairs", type=args.count, default=2, help="alternated pairs of runs (default 2)")
    p.add_argument("--out", type=Path, required=True, help="directory for the runs' JSON, logs and ab.json")
    p.add_argument("--work-args", metavar="ARGS",
                   help="more bench.suite arguments for the working tree's runs only (one string, split as a shell "
                        "would), after those after --: with --base-tree . an A/B of a setting on the same code")
    p.add_argument("--first", choices=("base", "work"), default="base",
                   help="the side that runs first in odd pairs (default base; even pairs swap); to alternate the "
                        "order over several invocations of one pair each")
    a = p.parse_args(argv)
    given = a.work_args is not None
    try:
        a.work_args = shlex.split(a.work_args or "")
    except ValueError as exc:
        p.error(f"--work-args: {exc}")
    if given and not a.work_args:
        p.error("--work-args is empty: give the suite arguments for the working tree's runs, or leave it out")
    if any(x in ("--json", "--png") or x.startswith(("--json=", "--png=")) for x in suite_args + a.work_args):
        p.error("the suite's --json/--png are set by bench.ab (one file per run under --out)")
    _check_suite_args(p, suite_args)
    if a.work_args:
        _check_suite_args(p, suite_args + a.work_args, "--work-args with the arguments after --")
    if a.base_tree is not None:
        missing = [d for d in _TREE_PATHS if not (a.base_tree / d).is_dir()]
        if missing:
            p.error(f"--base-tree {a.base_tree} has no {', '.join(f'{d}/' for d in missing)}")
    return a, suite_args


def out_problem(a: argparse.Namespace) -> str | None:
    """Why the runs cannot write under ``--out``, as ``--out DIR: <reason>``, or None: checked before anything is
    extracted or run, and nothing is made (the folder is made, its parents too, once the base is known to exist).

    An existing ``--out`` must be a writable folder (:func:`inferbus._paths.folder_problem`) in which each file the
    runs write (``ab.json``, ``<side>-<pair>.json`` and ``.log``) can be written
    (:func:`inferbus._paths.output_file_problem`), and with ``--base``, ``base-tree`` must not be a file; a missing
    one needs its nearest existing parent to be a writable folder.
    """
    out: Path = a.out
    if out.exists():
        problem = folder_problem(out)  # it exists: nothing is made
        if problem:
            return f"--out {out}: {problem}"
        names = ["ab.json", *(f"{side}-{i}.{ext}" for i in range(1, a.pairs + 1) for side in ("base", "work")
                              for ext in ("json", "log"))]
        for name in names:
            problem = output_file_problem(out / name, name)
            if problem:
                return f"--out {out}: cannot write {out / name}: {problem.split(';')[0]}"
        if a.base_tree is None and (out / "base-tree").exists() and not (out / "base-tree").is_dir():
            return f"--out {out}: {out / 'base-tree'}, where the base is extracted, is a file"
        return None
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out {out}: its folder {parent} is not writable"
    return None


def main(argv: list[str] | None = None) -> int:
    a, suite_args = _parse(argv)
    problem = out_problem(a)
    if problem:  # one line, exit 2, before the base is extracted or any suite runs
        print(f"error: {problem}", file=sys.stderr)
        return 2
    out: Path = a.out.resolve()
    if a.base_tree is not None:
        base_tree, commit = a.base_tree, f"tree:{a.base_tree.resolve()}"
    else:
        base_tree = out / "base-tree"
        try:
            commit = extract(a.base, base_tree)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)  # made once the base is known to exist: the runs' logs go here
    trees = {"base": base_tree.resolve(), "work": ROOT}
    used = {name: imported_from(tree) for name, tree in trees.items()}
    for name, tree in trees.items():
        if not Path(used[name]).resolve().is_relative_to(tree):
            print(f"error: with {tree} first on PYTHONPATH, inferbus is imported from {used[name]}; the {name} "
                  "runs would not run that tree's code", file=sys.stderr)
            return 1
    runs: dict[tuple[str, int], dict] = {}
    failed = []
    for i in range(1, a.pairs + 1):
        for name in (("base", "work") if (i % 2) == (a.first == "base") else ("work", "base")):
            js, log = out / f"{name}-{i}.json", out / f"{name}-{i}.log"
            side_args = suite_args + (a.work_args if name == "work" else [])
            print(f"[{name}-{i}] python -m bench.suite {shlex.join(side_args)}", flush=True)
            with open(log, "wb") as fh:
                rc = subprocess.run([sys.executable, "-m", "bench.suite", *side_args, "--json", str(js)],
                                    cwd=trees[name], env=_env(trees[name]), stdout=fh,
                                    stderr=subprocess.STDOUT).returncode
            if rc != 0 or not js.exists():
                failed.append(f"{name}-{i} (exit {rc}, log {log})")
                continue
            runs[(name, i)] = json.loads(js.read_text())
    if failed:
        print("failed runs: " + "; ".join(failed), file=sys.stderr)
    pairs = [i for i in range(1, a.pairs + 1) if ("base", i) in runs and ("work", i) in runs]  # both halves ran
    if not pairs:
        return 1
    doc = {"base_rev": a.base or str(a.base_tree), "base_commit": commit, "work_head": subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "work_dirty": bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *_TREE_PATHS],
                                          capture_output=True, text=True).stdout.strip()),
        "suite_args": suite_args, "work_args": a.work_args, "imported_from": used, "failed_runs": failed,
        "compared_pairs": pairs, **compare([runs[("base", i)] for i in pairs], [runs[("work", i)] for i in pairs])}
    try:
        (out / "ab.json").write_text(json.dumps(doc, indent=1))
        written = True
    except OSError as exc:  # checked before the runs; changed since (removed, full): one line, not a traceback
        print(f"error: --out {a.out}: cannot write {out / 'ab.json'}: {exc.strerror or exc}", file=sys.stderr)
        written = False
    render(doc)  # the table still shows the comparison when ab.json could not be written
    if written:
        print(f"wrote {out / 'ab.json'}")
    return 1 if failed or not written or any(r["wrong"] for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
