"""Usage errors of ``inferbus infer`` and ``inferbus chaos run`` as a user meets them: one line on stderr that starts
``error: ``, as every other command's usage error does, exit 2, nothing on stdout, no traceback; refused before
connecting (the NATS URL given is one nothing listens at: a connection attempt would be exit 3). The other commands'
refusals with exit 2 (``devices``, ``bench --suite``, ``up``) start the same way; and output that cannot be written
(``> /dev/full``, ``2> /dev/full``)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import nats
import numpy as np
import pytest

from inferbus.bus import Subjects, free_port
from inferbus.schemas._internal import LoadReport, encode_internal

from conftest import ROOT, cli_in_process, uvloop_backend as anyio_backend  # noqa: F401 (anyio_backend: uvloop only)

pytestmark = pytest.mark.timeout(60)


def cli(*args: str, cwd=ROOT, env: dict | None = None, own_process: bool = False) -> subprocess.CompletedProcess:
    """``inferbus *args`` in an environment of ``COLUMNS`` and ``PATH`` alone (plus ``env``). Run in this process
    (:func:`conftest.cli_in_process`): each is a refusal, parsing alone, and a process costs ~0.5 s of imports (35
    calls here, several per test: ~1 minute of the suite); as ``python -m inferbus.cli`` in a process of its own
    where ``env`` sets ``PYTHONPATH`` (what the interpreter imports from) or ``own_process`` asks: a command that
    goes on to connect or start (it sets signal handlers and an event loop policy, which would stay in this test
    process), or one whose words name the command path (``python -m inferbus.cli``, not ``inferbus``)."""
    environ = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", **(env or {})}
    if "PYTHONPATH" not in environ and not own_process:
        return cli_in_process(list(args), cwd=cwd, env=environ)
    return subprocess.run([sys.executable, "-m", "inferbus.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=30, env=environ)


def assert_one_error_line(p: subprocess.CompletedProcess, said: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-1000:])
    assert p.stderr.startswith(f"error: {said}"), p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr and not p.stdout, (p.stdout, p.stderr)
    assert "cannot reach NATS" not in p.stderr


@pytest.mark.parametrize("args,said", [
    # each exit-2 path of `chaos run` (they printed the message alone, with no "error: ")
    # (and each starts "chaos run: " as every command's refusal starts with its command; the range checks said
    # "drill NAME: bad option: ...", where every other command says "COMMAND: --option must be ..., got ...")
    (("no-such-drill",), "chaos run: unknown drill 'no-such-drill'; known drills: "),
    (("worker-crash", "--latency-ms", "50"), "chaos run: drill worker-crash does not take --latency-ms"),
    (("worker-crash", "--rate", "-5"), "chaos run: --rate must be in (0, 1,000,000] requests/s, got -5\n"),
    (("soak", "--faults", "bogus", "--duration", "1"), "chaos run: --faults: unknown fault 'bogus'; known: "),
    # the argument parser's (already "error: ")
    (("worker-crash", "--rate", "x"), "chaos run: --rate must be a number, got 'x' (see "),
    # found by a fresh-user trial: a KeyError traceback after a 17 s cluster start; a soak with no fault, exit 0;
    # a FileExistsError traceback
    (("nats-node-loss", "--server", "Z9"), "chaos run: --server must be one of the topology's servers (A1, A2, A3, "
                                           "B1, B2, B3, W1, W2, W3), got 'Z9'\n"),
    (("soak", "--faults", ","), "chaos run: --faults names no fault; give one or more, comma-separated, of: "),
    (("worker-crash", "--run-dir", "/etc/passwd"), "chaos run: --run-dir /etc/passwd: exists and is not a folder"),
    # a soak too short for its first fault ran, injected nothing and passed (a fresh-user trial)
    (("soak", "--duration", "4", "--fault-every", "1"), "chaos run: drill soak: --duration 4 leaves no time for a "
                                                        "fault: the first comes 0.5 s in"),
    (("worker-crash", "--min-availability", "1.5"), "chaos run: --min-availability must be in [0, 1] (a share of "
                                                    "the requests), got 1.5\n"),
    (("gateway-degrade", "--links", "moon"), "chaos run: --links must be 'regions' or 'all', got 'moon'\n"),
    (("gateway-degrade", "--fault-at", "-1"), "chaos run: --fault-at must be in [0, 86400] seconds, got -1\n"),
    (("region-failover", "--fault-at", "100", "--duration", "5"), "chaos run: drill region-failover: --fault-at 100 "
                                                                  "is not within the load's --duration 5"),
], ids=["unknown-drill", "option-not-taken", "option-out-of-range", "unknown-fault", "parser", "unknown-server",
        "no-fault", "run-dir-a-file", "soak-too-short", "min-availability", "links", "fault-at", "fault-at-late"])
def test_chaos_run_usage_errors_are_one_error_line_exit_2(args, said):
    assert_one_error_line(cli("chaos", "run", *args), said)


def test_every_infer_usage_error_is_one_error_line_exit_2(tmp_path):
    """The ``--input`` file errors printed ``cannot read FILE: ...`` with no ``error: ``; the other checks had it."""
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((1, 64), np.float32))
    junk = tmp_path / "junk.npy"
    junk.write_text("not numpy")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    truncated = tmp_path / "truncated.npy"
    truncated.write_bytes(objects.read_bytes()[:20])
    missing = tmp_path / "missing.npy"
    for args, said in [
        (("-i", f"pixels={missing}"), f"cannot read {missing}: No such file or directory; --input takes a .npy file"),
        (("-i", f"pixels={tmp_path}"), f"cannot read {tmp_path}: Is a directory"),
        (("-i", f"pixels={junk}"), f"cannot read {junk}: not a .npy file"),
        (("-i", f"pixels={objects}"), f"cannot read {objects}: the array holds Python objects"),
        (("-i", f"pixels={truncated}"), f"cannot read {truncated}: a damaged .npy file"),
        (("-i", f"pixels={good}", "-i", f"pixels={good}"), "infer: input 'pixels' given twice"),
        (("-i", f"pixels={good}", "--timeout-s", "0"), "infer: --timeout-s must be in (0, 600] seconds, got 0"),
        (("-i", "pixels"), "infer: --input takes NAME=FILE.npy, got 'pixels'"),
    ]:
        assert_one_error_line(cli("infer", "digits", *args, "--nats-url", url), said)


@pytest.mark.parametrize("spec,said", [
    # an empty NAME was sent and refused by the server (INVALID_ARGUMENT: unexpected input ''), an empty FILE was
    # "cannot read : No such file or directory"; both now fail as a spec with no '=' does, naming the --input value
    ("={good}", "infer: --input takes NAME=FILE.npy, got '={good}' (no NAME before '=')"),
    ("=", "infer: --input takes NAME=FILE.npy, got '=' (no NAME before '=')"),
    ("pixels=", "infer: --input takes NAME=FILE.npy, got 'pixels=' (no FILE after '=')"),
    ("{good}", "infer: --input takes NAME=FILE.npy, got '{good}' (see "),
], ids=["empty-name", "empty-both", "empty-file", "no-equals"])
def test_a_malformed_input_spec_is_refused_before_connecting_naming_it(tmp_path, spec, said):
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((1, 64), np.float32))
    spec, said = spec.format(good=good), said.format(good=good)
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there: a request would be "cannot reach NATS", exit 3
    p = cli("infer", "digits", "-i", spec, "--nats-url", url, own_process=True)
    assert_one_error_line(p, said)
    assert p.stderr.rstrip().endswith("(see python -m inferbus.cli infer --help)"), p.stderr
    # every --input's form is checked before any file is read: the bad one is named even after a missing file
    p = cli("infer", "digits", "-i", f"pixels={tmp_path / 'missing.npy'}", "-i", spec, "--nats-url", url)
    assert_one_error_line(p, said)


def test_a_command_started_with_stdout_or_stdin_closed_runs_as_with_them_on_dev_null():
    """``inferbus models ... >&-``: the first socket used to take descriptor 1, and uvloop aborted the process on
    closing it (``uv__close: Assertion `fd > STDERR_FILENO' failed``, exit 134); with stdout closed the import
    failed before that (``sys.stdout`` is None). Now the closed descriptors are held by /dev/null: the command
    runs to its own status, its error line on the stderr that is open."""
    import os

    def closed(*fds):
        def pre():
            for fd in fds:
                os.close(fd)
        return pre

    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there: exit 3 after a connection attempt
    for fds in ((1,), (0, 1)):
        p = subprocess.run([sys.executable, "-m", "inferbus.cli", "models", "--nats-url", url], cwd=ROOT,
                           stderr=subprocess.PIPE, text=True, timeout=30, preexec_fn=closed(*fds),
                           env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert p.returncode == 3, (fds, p.returncode, p.stderr[-1500:])
        assert p.stderr.startswith(f"cannot reach NATS at {url}") and "Traceback" not in p.stderr, (fds, p.stderr)
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "chaos", "list"], cwd=ROOT, stderr=subprocess.PIPE,
                       text=True, timeout=30, preexec_fn=closed(1), env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and not p.stderr, (p.returncode, p.stderr[-1500:])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("unbuffered", [{}, {"PYTHONUNBUFFERED": "1"}], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("argv", [("models", "--help"), ("chaos", "list")])
def test_output_that_cannot_be_written_is_one_line_exit_1(argv, unbuffered):
    """stdout on a full device (``> /dev/full``, ENOSPC): one line on stderr naming the failure, exit 1; it was
    rich's traceback of the OSError (a fresh-user trial: ``infer ... > /dev/full``, ~60 lines). ``chaos list``
    prints through Click's echo, which tries its stream with a write of ``""`` inside ``except Exception``: with
    stdout unbuffered (``PYTHONUNBUFFERED=1``, common in containers and CI) that write is where it failed, the error
    was swallowed and the output lost without a word, exit 0."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "inferbus.cli", *argv], cwd=ROOT, stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=30,
                           env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **unbuffered})
    assert p.returncode == 1, (p.returncode, p.stderr[-1500:])
    assert p.stderr == "error: cannot write the output (stdout): No space left on device\n", p.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_stderr_that_cannot_be_written_keeps_the_commands_exit_status(tmp_path):
    """``2> /dev/full``: the error line is lost, but the exit status is still the command's own (NATS out of reach:
    3; a usage error: 2), not 1 as for any failed write; a command that succeeded with a stderr line lost exits 1."""
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((1, 64), np.float32))
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    say_on_stderr = ("import sys; from inferbus.cli import app, main; "
                     "app.command('say')(lambda: print('a line', file=sys.stderr)); sys.argv[1:] = ['say']; main()")
    for argv, status in (([sys.executable, "-m", "inferbus.cli", "infer", "digits", "-i", f"pixels={good}",
                           "--nats-url", url], 3),
                         ([sys.executable, "-m", "inferbus.cli", "infer", "digits", "-i",
                           f"pixels={tmp_path / 'missing.npy'}", "--nats-url", url], 2),
                         ([sys.executable, "-c", say_on_stderr], 1)):
        with open("/dev/full", "w") as full:
            p = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=full, text=True, timeout=30,
                               env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert (p.returncode, p.stdout) == (status, ""), (argv, p.returncode, p.stdout[-1500:])


def test_a_failed_device_probe_is_one_error_line_exit_2(tmp_path):
    """``inferbus devices`` whose probe subprocess fails (a stand-in ``pynvml`` that dies on import, as a broken
    driver install can): one line ``error: devices: ...`` with the probe's stderr on it, exit 2; it was ``device
    probe failed: ...`` with no ``error: `` and the probe's stderr over several lines."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "pynvml.py").write_text("import sys\nsys.stderr.write('NVML stand-in: broken\\non two "
                                                 "lines\\n')\nraise SystemExit(1)\n")
    p = cli("devices", env={"PYTHONPATH": str(tmp_path / "site")})
    assert_one_error_line(p, "devices: device probe failed (1): ")
    assert p.stderr.endswith(" NVML stand-in: broken on two lines\n"), p.stderr


def test_bench_suite_outside_a_checkout_is_one_error_line_exit_2(tmp_path):
    """``bench --suite`` needs the repository's bench/ folder (run from a checkout's root): one line, exit 2; it
    was the message without ``error: ``."""
    p = cli("bench", "--suite", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert_one_error_line(p, "bench: --suite needs the repository's bench/ folder: run it from a checkout's root")


@pytest.mark.parametrize("args,said", [
    (("--duration", "1e9"), "bench: --duration must be in (0, 86400] seconds, got 1000000000"),
    (("--timeout-s", "inf"), "bench: --timeout-s must be in (0, 3600] seconds, got inf"),
])
def test_bench_suite_refuses_the_ranges_a_load_run_refuses(args, said):
    """``bench --suite --duration 1e9`` was handed to the suite and run, while a load run caps it at a day: refused
    the same way, one line, exit 2, before the suite starts (from a checkout's root, where it would run)."""
    p = cli("bench", "--suite", *args, env={"PYTHONPATH": str(ROOT)})
    assert_one_error_line(p, said)
    assert p.stderr == f"error: {said}\n", p.stderr


@pytest.mark.anyio
async def test_up_with_a_node_id_in_use_is_one_error_line_exit_2(nats_server, tmp_path):
    """A worker of node ``n1`` reports on the NATS and prefix ``up --nats-url ... --node-id n1`` would join (here a
    stand-in publishing its load reports): refused, one line ``error: up: node id 'n1' is in use ...``, exit 2; it
    was ``cannot start: ...``, with no ``error: ``."""
    nc = await nats.connect(nats_server.url)
    stop = asyncio.Event()

    async def reports() -> None:
        report = LoadReport(worker_id="n1-w0", pid=1, device_kind="cpu", device_name="cpu", backend="onnxruntime",
                            precision="fp32", models=["digits:1"], queue_depth=0, in_flight=0, capacity=1024,
                            ewma_service_us=50.0, completed=0, errors=0)
        while not stop.is_set():
            await nc.publish(Subjects("p").load, encode_internal(report))
            await asyncio.sleep(0.05)

    beat = asyncio.ensure_future(reports())
    try:
        await nc.flush()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "inferbus.cli", "up", "--nats-url", nats_server.url, "--prefix", "p", "--node-id",
            "n1", "--no-cache", "--workers", "1", "--model", "digits", "--run-dir", str(tmp_path / "run"), cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        out, err = await asyncio.wait_for(proc.communicate(), 45)
    finally:
        stop.set()
        await beat
        await nc.close()
    p = subprocess.CompletedProcess([], proc.returncode, out.decode(), err.decode())
    assert_one_error_line(p, f"up: node id 'n1' is in use on {nats_server.url} with prefix 'p' (live workers n1-w0)")


def test_a_device_probe_killed_by_a_signal_says_which(tmp_path):
    """A probe killed by a signal (a stand-in ``pynvml`` that SIGKILLs its process, as the OOM killer would) said
    ``device probe failed (-9): `` with an empty reason: it names the signal."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "pynvml.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    p = cli("devices", env={"PYTHONPATH": str(tmp_path / "site")})
    assert_one_error_line(p, "devices: device probe failed (killed by signal 9 (SIGKILL))")


@pytest.mark.parametrize("argv,said", [
    (("cluster", "config", "--out", "cfg", "--data-root", ""), "cluster config: --data-root"),
    (("cluster", "config", "--out", ""), "cluster config: --out"),
    (("cluster", "up", "--run-dir", ""), "cluster up: --run-dir"),
    (("up", "--run-dir", ""), "up: --run-dir"),
    (("chaos", "run", "worker-crash", "--run-dir", ""), "chaos run: --run-dir"),
], ids=["config-data-root", "config-out", "cluster-up-run-dir", "up-run-dir", "chaos-run-dir"])
def test_an_empty_folder_option_is_one_error_line_and_writes_nothing(tmp_path, argv, said):
    """``Path('')`` is ``Path('.')``: an empty folder (an unset variable in a script) was the current folder without a
    word: ``cluster config --data-root ''`` wrote ``store_dir: "js/W1"`` (the servers' own folder), ``cluster up
    --run-dir ''`` ran the topology in the current folder ("run dir ."), as ``up`` and ``chaos run`` did. One line,
    exit 2, nothing started or written; ``.`` says the current folder on purpose."""
    p = cli(*argv, cwd=tmp_path)
    assert_one_error_line(p, f"{said} must name a folder, got '' (give '.' for the current one)\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command,options", [(("up",), ()), (("cluster", "up"), ()), (("bench",), ("--suite",)),
                                             (("bench",), ("--nats-url", "nats://127.0.0.1:1"))],
                         ids=["up", "cluster up", "bench --suite", "bench --nats-url"])
@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
def test_an_empty_or_blank_models_is_one_error_line_and_reads_no_folder(tmp_path, command, options, value):
    """``up --models ''`` (and ``cluster up``'s, ``bench``'s) served the current folder as the model repository
    (``Path('')`` is ``.``); a blank one was refused as a folder that does not exist (``bench``: it connected, exit 3,
    or handed ``--models-dir .`` to the suite). Both are now the error of an empty ``--run-dir``. The current folder
    here holds an unreadable model, so that reading it is seen (and refused) at once."""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    p = cli(*command, "--models", value, *options, cwd=tmp_path)
    assert_one_error_line(p, f"{' '.join(command)}: --models must name a folder, got {value!r} (give '.' for the "
                             f"current one)\n")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["broken"]


@pytest.mark.parametrize("what", ["missing", "file"])
def test_bench_on_a_models_that_is_no_folder_is_one_error_line_before_connecting(tmp_path, what):
    """``bench digits --nats-url ... --models /nonexist`` (or a file) printed a 115-line traceback, exit 1 (a
    fresh-user trial), where ``up`` says it in one line. Refused as ``up`` refuses it, before connecting (port 1)."""
    path = tmp_path / "nonexist"
    if what == "file":
        path.write_text("not a repository")
    p = cli("bench", "digits", "--nats-url", "nats://127.0.0.1:1", "--models", str(path), "--duration", "0.5",
            "--concurrency", "1")
    assert_one_error_line(p, f"bench: the model repository {path} is not a folder (--models)\n")


def test_up_on_a_triton_ensemble_is_one_error_line_and_starts_nothing(tmp_path):
    """A Triton ensemble folder (its version folder empty) stopped ``up`` with only ``no <version>/model.onnx found``;
    next to a model.onnx it was served as that model. Refused as every malformed config is, naming the model."""
    cfg = tmp_path / "models" / "pipe" / "config.json"
    (cfg.parent / "1").mkdir(parents=True)
    cfg.write_text('{"platform": "ensemble", "ensemble_scheduling": {"step": []}}')
    p = cli("up", "--no-cache", "--workers", "1", "--models", str(cfg.parent.parent), "--run-dir",
            str(tmp_path / "run"))
    assert_one_error_line(p, f"up: the model repository cannot be served: {cfg}: model 'pipe': platform \"ensemble\" "
                             f"and ensemble_scheduling: Triton ensembles are not supported: ")
    assert not (tmp_path / "run").exists()


def _help_text(*argv: str) -> str:
    import re

    r = cli(*argv, "--help")
    assert r.returncode == 0, r.stderr
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.stdout).split())


def test_chaos_run_takes_timeout_s_as_every_command_and_timeout_still():
    """``chaos run`` named the request budget ``--timeout`` where every other command says ``--timeout-s`` (``No such
    option: --timeout-s``): ``--timeout-s`` is its name in the help, ``--timeout`` the older name of the same option
    (a range error names the one typed), in the words every other command's ``--timeout-s`` refusal uses (a fresh-user
    trial: chaos said ``in (0, 600] s`` where ``health`` said ``at most 600 seconds``)."""
    for flag in ("--timeout-s", "--timeout"):
        p = cli("chaos", "run", "worker-crash", flag, "0")
        assert_one_error_line(p, f"chaos run: {flag} must be in (0, 600] seconds, got 0")
        assert p.stderr.endswith("got 0\n"), p.stderr  # as typed (it was "got 0.0")
        p = cli("chaos", "run", "worker-crash", flag, "600.0001")
        assert p.stderr == f"error: chaos run: {flag} must be in (0, 600] seconds, got 600.0001\n", p.stderr
        # the same words as health's own refusal of the same value
        h = cli("health", "--timeout-s", "600.0001", "--nats-url", "nats://127.0.0.1:1")
        assert h.stderr.split(" --timeout-s ", 1)[1] == p.stderr.split(f" {flag} ", 1)[1], (h.stderr, p.stderr)
    text = _help_text("chaos", "run")
    assert "--timeout-s, --timeout <float> Per-request budget, seconds" in text, text


@pytest.mark.parametrize("argv", [
    ("infer", "digits", "-i", "pixels={good}"), ("health",), ("models",), ("models", "load", "digits", "1"),
    ("models", "unload", "digits", "1"), ("region", "status"), ("region", "promote", "A"), ("region", "demote"),
    ("region", "manager", "A"), ("bench", "digits", "--concurrency", "1")])
def test_an_empty_nats_url_is_one_error_line_exit_2_before_connecting(tmp_path, argv):
    """``--nats-url ''`` (an unset variable in a script): ``infer``, ``health``, ``models`` and ``bench`` printed the
    SDK's ``INVALID_ARGUMENT: Client.connect: servers names no NATS URL ...`` (no ``error: ``), ``models load`` and
    ``region`` took the default URL (exit 3, or the wrong NATS), ``region manager`` ended in a traceback. One line
    naming the option, exit 2, nothing connected; given before a ``models`` subcommand, the same."""
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((1, 64), np.float32))
    argv = tuple(a.format(good=good) for a in argv)
    for url in ("", ","):
        r = cli(*argv, "--nats-url", url)
        assert_one_error_line(r, f"{' '.join(argv[:2]) if argv[0] in ('models', 'region') and len(argv) > 1 else argv[0]}"
                                 f": --nats-url {url!r} names no server; give nats://HOST:PORT[,nats://HOST:PORT...]\n")
    if argv[0] == "models" and len(argv) > 1:  # the group's option, before the subcommand
        r = cli("models", "--nats-url", "", *argv[1:])
        assert_one_error_line(r, "models: --nats-url '' names no server; ")
    # a URL of another form: the same one line (it was the SDK's "INVALID_ARGUMENT: Client.connect: ..." for the
    # client commands, without "error: COMMAND:"; a fresh-user trial, 2026-12-05), the password not shown
    r = cli(*argv, "--nats-url", "http://u:s3cret@127.0.0.1:4222")
    name = ' '.join(argv[:2]) if argv[0] in ('models', 'region') and len(argv) > 1 else argv[0]
    assert_one_error_line(r, f"{name}: --nats-url 'http://u:***@127.0.0.1:4222': expected nats://HOST:PORT")


def test_region_manager_refuses_an_empty_lease_nats_url():
    """``--lease-nats-url ''`` was taken as not given: the lease went through the region's own servers."""
    r = cli("region", "manager", "A", "--nats-url", f"nats://127.0.0.1:{free_port()}", "--lease-nats-url", "")
    assert_one_error_line(r, "region manager: --lease-nats-url '' names no server; ")


def test_region_demote_to_the_region_it_demotes_is_a_usage_error():
    """A fresh-user trial: ``region demote B --to B`` answered "region B's manager is not live" (exit 1) of the live
    primary itself. It is now refused before anything is sent; without REGION the manager says the same."""
    r = cli("region", "demote", "B", "--to", "B", "--nats-url", f"nats://127.0.0.1:{free_port()}")
    assert_one_error_line(r, "region demote: --to names B, the region being demoted: name another region")


@pytest.mark.parametrize("argv,want", [
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--valkey-url", "foo://x"),
     "region manager: --valkey-url must start with redis://, rediss:// or unix://, got 'foo://x'\n"),
    (("a b", "--nats-url", "nats://127.0.0.1:{port}"), "region manager: REGION must be a region name (letters, "
                                                       "digits, '_' or '-'), got 'a b'\n"),
    # they named RegionConfig's fields, not the options, and not the value: "RegionConfig.replicas must be in 1..5"
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--lease-ms", "0"), "region manager: --lease-ms must be >= 2 × "
                                                                       "--heartbeat-ms (200 ms: the leader renews "
                                                                       "every heartbeat), got 0\n"),
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--replicas", "9"), "region manager: --replicas must be in [1, 5], "
                                                                       "got 9\n"),
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--heartbeat-ms", "5"), "region manager: --heartbeat-ms must be "
                                                                           "in [10, 60000] ms, got 5\n"),
    # --initial-wait-ms had no check: -1 was taken (and 10**20 too)
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--initial-wait-ms", "-1"), "region manager: --initial-wait-ms must "
                                                                               "be in [0, 3,600,000] ms, got -1\n"),
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--suspect-ms", "500"), "region manager: --suspect-ms must be in "
                                                                           "(0, 400] ms (at most --lease-ms), got 500\n"),
    # (a port out of range, a broken IPv6 host: ValueError tracebacks from the manager; a fresh-user trial)
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--valkey-url", "redis://127.0.0.1:99999/0"),
     "region manager: --valkey-url 'redis://127.0.0.1:99999/0': Port out of range"),
    (("Z", "--nats-url", "nats://127.0.0.1:{port}", "--valkey-url", "redis://[::1/0"),
     "region manager: --valkey-url 'redis://[::1/0': Invalid IPv6 URL"),
])
def test_region_manager_refuses_bad_values_in_one_line(argv, want):
    """A fresh-user trial: ``region manager Z --valkey-url foo://x`` was taken (the manager then failed to reach it
    over and over); a value the config refuses was a traceback."""
    port = free_port()
    assert_one_error_line(cli("region", "manager", *(a.format(port=port) for a in argv)), want)


def test_region_manager_that_cannot_reach_nats_is_one_line_exit_3():
    """It was a 78-line NoServersError traceback, exit 1, where every other command prints one line, exit 3."""
    port = free_port()
    r = cli("region", "manager", "Z", "--nats-url", f"nats://127.0.0.1:{port}", own_process=True)  # (it connects)
    assert (r.returncode, r.stdout) == (3, ""), r
    assert r.stderr.startswith(f"cannot reach NATS at nats://127.0.0.1:{port}: ") and r.stderr.count("\n") == 1, r.stderr


def _cluster_file(path, url: str) -> None:
    """A cluster.json as ``cluster up`` writes it (the fields the ``--cluster`` readers take), every URL ``url``."""
    import json

    path.write_text(json.dumps({"spec": {"regions": ["A", "B"], "witness": "W", "prefix": "ibt"},
                                "servers": {"W1": {"site": "W", "url": url}}, "client_urls": [url]}))


_NOT_OURS = "is not the cluster.json of 'inferbus cluster up': "


@pytest.mark.parametrize("case", ["empty-path", "fifo", "fifo-in-run-dir", "missing", "unreadable", "binary",
                                  "not-json", "empty-file", "a-list", "a-string", "not-ours", "bad-prefix"])
def test_both_cluster_file_readers_refuse_a_bad_cluster_file_in_the_same_words(tmp_path, case):
    """``cluster kill|...`` and ``region status|...`` each read ``--cluster`` with checks of their own, in other
    words: now one reader, the same line for each (after the command), exit 2, before connecting (a cluster.json
    whose URLs nothing listens at is in the current folder: reading it and connecting would be exit 3). ``--cluster
    ''`` was ``./cluster.json``; a JSON list was ``TypeError: list indices must be integers...``, a binary file
    ``UnicodeDecodeError: 'utf-8' codec can't decode...``, text that is no JSON the parser's ``Expecting ...
    (char 0)``: said plainly now."""
    if case == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    _cluster_file(tmp_path / "cluster.json", url)
    d = tmp_path / "d"
    d.mkdir()
    p = d / "c.json"
    given = str(p)
    if case == "empty-path":
        given, said = "", "--cluster must name the run dir of 'inferbus cluster up' or its cluster.json, got ''\n"
    elif case.startswith("fifo"):
        os.mkfifo(d / "cluster.json")
        given = str(d) if case == "fifo-in-run-dir" else str(d / "cluster.json")
        said = f"--cluster {given}: cannot read {d / 'cluster.json'}: not a regular file ("
    elif case == "missing":
        said = f"--cluster {p}: cannot read {p}: No such file or directory ("
    elif case == "unreadable":
        _cluster_file(p, url)
        p.chmod(0)
        said = f"--cluster {p}: cannot read {p}: Permission denied\n"
    else:
        content, said = {
            "binary": (b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}\xff\xfe", "is not JSON: it holds binary data, not text ("),
            "not-json": (b"{not json", "is not JSON: its text does not parse at line 1, column 2 ("),
            "empty-file": (b"\n", "is empty, not JSON ("),
            "a-list": (b"[1, 2]", "holds an array, not the JSON object of a cluster.json ("),
            "a-string": (b'"cluster"', "holds a string, not the JSON object of a cluster.json ("),
            "not-ours": (b'{"x": 1}', _NOT_OURS),
            "bad-prefix": (f'{{"spec": {{"regions": ["A"], "witness": "W", "prefix": "a b"}}, "servers": {{"W1": '
                           f'{{"site": "W", "url": "{url}"}}}}, "client_urls": ["{url}"]}}'.encode(),
                           "its spec's prefix must be dot-separated tokens of letters, digits, '_' or '-', got 'a b'\n"),
        }[case]
        p.write_bytes(content)
        said = f"--cluster {p}: " + ("" if case == "bad-prefix" else f"{p} ") + said
    lines = []
    for command in (("cluster", "kill", "A"), ("region", "status")):
        r = cli(*command, "--cluster", given, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
        assert_one_error_line(r, f"{command[0]} {command[1]}: {said}")
        for internal in ("Expecting", "char 0", "b'\\x", "Error", "codec", "indices", "NUMPY"):
            assert internal not in r.stderr, (internal, r.stderr)
        lines.append(r.stderr.split(": ", 2)[2])
    if case != "not-ours":  # the same words from both (not-ours: each says which field it lacks)
        assert lines[0] == lines[1], lines


@pytest.mark.parametrize("argv,said", [
    (("kill", "Z"), "cluster kill: REGION 'Z': not a region of the cluster in {f}; its regions: A, B\n"),
    (("restore", "Z"), "cluster restore: REGION 'Z': not a region of the cluster in {f}; its regions: A, B\n"),
    (("kill", "W"), "cluster kill: REGION 'W': not a region of the cluster in {f}; its regions: A, B (W is the "
                    "witness site; kill acts on regions)\n"),
    (("isolate", "Z"), "cluster isolate: SITE 'Z': not a site of the cluster in {f}; its sites: A, B, W\n"),
    (("partition", "A,Z", "B"), "cluster partition: SIDE_A 'Z': not a site of the cluster in {f}; its sites: A, B, "
                                "W\n"),
    (("partition", "A", ","), "cluster partition: SIDE_B names no site; give one or more of the cluster's sites, "
                              "comma-separated: A, B, W\n"),
], ids=["kill", "restore", "kill-the-witness", "isolate", "partition", "partition-no-site"])
def test_cluster_control_refuses_a_region_or_site_its_cluster_file_does_not_name(tmp_path, argv, said):
    """``cluster kill Z`` connected to the witness and came back refused by the cluster (or, for a partition, cut
    nothing for the unknown site): the names are checked against the cluster.json first, one line naming the known
    ones, exit 2 (nothing listens at the file's URLs: connecting would be exit 3)."""
    url = f"nats://127.0.0.1:{free_port()}"
    _cluster_file(tmp_path / "cluster.json", url)
    r = cli("cluster", *argv, "--cluster", str(tmp_path))
    assert_one_error_line(r, said.format(f=tmp_path / "cluster.json"))
    assert r.stderr == "error: " + said.format(f=tmp_path / "cluster.json"), r.stderr
    # a name it has goes on to connect: exit 3, the witness out of reach
    good = {"kill": ("kill", "B"), "restore": ("restore", "A"), "isolate": ("isolate", "W"),
            "partition": ("partition", "A", "B,W")}[argv[0]]
    r = cli("cluster", *good, "--cluster", str(tmp_path), "--timeout-s", "2", own_process=True)
    assert r.returncode == 3 and r.stderr.startswith(f"cannot reach NATS at {url}"), (r.returncode, r.stderr)


def test_cluster_config_lists_every_file_it_wrote(tmp_path):
    """``cluster config`` printed its server and Valkey configs but not the cluster.json it wrote beside them (what
    ``region ... --cluster`` reads)."""
    out = tmp_path / "cfg"
    r = cli("cluster", "config", "--out", str(out), "--base-port", "14000")
    assert r.returncode == 0, (r.stdout, r.stderr)
    listed = r.stdout.splitlines()
    assert sorted(listed) == sorted(str(f) for f in out.iterdir()) and str(out / "cluster.json") in listed, listed
    assert len(listed) == len(set(listed)), listed


def test_region_and_cluster_spell_timeout_s_alike():
    """``region`` built its ``--timeout-s`` with one helper and ``cluster`` with a constant of other words ("Budget
    in seconds for the connect and the cluster's answer together"): one spelling now, each command's default and
    what it covers kept."""
    lead = "--timeout-s <float> Budget of the command in seconds, in (0, 600]: connecting to NATS, "
    for argv, covers, default in (
            (("region", "status"), "listening 0.35 s for heartbeats", "2.5"),
            (("region", "promote"), "and the region manager's answer", "10.0"),
            (("region", "demote"), "listening 0.35 s for the primary's heartbeat", "10.0"),
            (("cluster", "kill"), "and the cluster's answer", "60.0"),
            (("cluster", "heal"), "and the cluster's answer", "60.0")):
        text = _help_text(*argv)
        assert lead + covers in text, (argv, text)
        assert f"[default: {default}]" in text.split("--timeout-s", 1)[1], (argv, text)


def test_up_on_a_nats_url_where_nothing_listens_says_so_once_without_a_lost_connection_warning(tmp_path):
    """``up --nats-url`` where nothing listens printed ``node n3: lost its NATS connection (its server) ...`` before
    ``cannot reach NATS ...``: the node's warning for a connection it loses, for one it never had (nats-py calls the
    disconnect callback on a first connect that fails). One line, exit 3, as before the warning existed."""
    from inferbus.bus import free_port

    url = f"nats://127.0.0.1:{free_port()}"
    p = cli("up", "--nats-url", url, "--node-id", "n3", "--workers", "1", "--no-cache", "--run-dir",
            str(tmp_path / "run"), own_process=True)  # (it starts a node: its signal handlers, its event loop)
    assert p.returncode == 3 and "cannot reach NATS" in p.stderr, p
    assert "lost its NATS connection" not in p.stderr, p.stderr


def _number_options() -> list[tuple[tuple[str, ...], str, type, tuple[str, ...]]]:
    """Every option of every command that takes an integer or a number: (command words, option, int or float, the
    command's required arguments and options given dummy values, so that only the option under test is wrong)."""
    from typing import get_args

    import typer

    from inferbus.cli import app

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + (name,))
        else:
            yield path, cmd

    found = []
    for path, cmd in walk(typer.main.get_command(app), ()):
        required: list[str] = []
        for p in cmd.params:
            if p.required:
                required += ["A"] if p.param_type_name == "argument" else [p.opts[0], "a=b.npy"]
        for p in cmd.params:
            annotation = p.type_descriptor.annotation
            kinds = {annotation, *get_args(annotation)} & {int, float}
            if p.param_type_name == "option" and kinds:
                found.append((path, p.opts[0], kinds.pop(), tuple(required)))
    return found


NUMBER_OPTIONS = _number_options()


def test_the_walk_over_the_number_options_finds_them():
    options = {(" ".join(path), opt) for path, opt, _, _ in NUMBER_OPTIONS}
    assert {("up", "--workers"), ("up", "--busy-poll-us"), ("cluster up", "--regions"), ("region manager", "--lease-ms"),
            ("chaos run", "--fault-at"), ("bench", "--gens"), ("health", "--timeout-s")} <= options, options
    assert len(options) > 60, len(options)


@pytest.mark.parametrize("path,option,kind,required", NUMBER_OPTIONS,
                         ids=[f"{' '.join(p)} {o}" for p, o, _, _ in NUMBER_OPTIONS])
def test_a_number_option_given_no_number_is_refused_in_the_projects_words(path, option, kind, required, monkeypatch,
                                                                          capsys):
    """Typer 0.29 parses option values with pydantic, whose words showed through in every such refusal (a fresh-user
    trial): ``Invalid value for '--workers': Input should be a valid integer, unable to parse string as an
    integer``. Now ``--workers must be an integer, got 'x'``, as every refusal names an option and echoes the value
    (a number unquoted: ``--workers 1.5`` is ``got 1.5``). In-process: the parser refuses before the command runs."""
    from inferbus.cli import _run_app

    want = "an integer" if kind is int else "a number"
    cases = [("x", "'x'"), ("0x10", "'0x10'")] + ([("1.5", "1.5"), ("1e3", "1e3")] if kind is int else [])
    for value, shown in cases:
        monkeypatch.setattr(sys, "argv", ["inferbus", *path, *required, option, value])
        with pytest.raises(SystemExit) as exit_:
            _run_app()
        err = capsys.readouterr().err
        assert exit_.value.code == 2, err
        assert err.startswith(f"error: {' '.join(path)}: {option} must be {want}, got {shown} (see "), err
        assert err.count("\n") == 1 and "Input should" not in err and "Invalid value" not in err, err


def test_devices_refuses_an_unknown_backend_in_one_line_before_the_probe():
    """``devices --backends foo`` probed the devices, printed the table and then a red ``plan for --backends foo:
    unknown backend 'foo'; known: ...`` on stdout, exit 1; ``up --backends foo`` refuses it (exit 2). Now the same
    refusal, in the form of every other one."""
    p = cli("devices", "--backends", "foo,jax")
    assert_one_error_line(p, "devices: --backends must each be one of onnxruntime, jax, tensorrt, got 'foo,jax'\n")


@pytest.mark.parametrize("asked,same_as", [
    (("-h", "up"), ("up", "--help")), (("--help", "up"), ("up", "--help")), (("help", "up"), ("up", "--help")),
    (("-h", "models", "load"), ("models", "load", "--help")), (("help", "region", "manager"),
                                                               ("region", "manager", "--help")),
    (("help",), ("--help",))], ids=["-h up", "--help up", "help up", "-h models load", "help region manager", "help"])
def test_help_asked_before_the_command_prints_the_commands_help(asked, same_as):
    """``inferbus -h up`` printed the root help: Click's group takes its ``-h`` as soon as it meets it. The request
    for help before a command's words now prints that command's help, as ``inferbus up --help`` does; ``inferbus
    help up`` too."""
    want = cli(*same_as)
    assert want.returncode == 0 and "Usage:" in want.stdout, want
    got = cli(*asked)
    assert (got.returncode, got.stdout, got.stderr) == (0, want.stdout, ""), (got.stdout[:300], want.stdout[:300])


def test_help_before_a_word_that_is_no_command_is_refused_as_an_unknown_command():
    p = cli("help", "nosuch")
    assert_one_error_line(p, "inferbus: No such command 'nosuch'.")


_NEEDS = {  # what an option needs to be checked at all, in the place of its command's _COMMAND_ARGS
    ("up", "--nats-port"): ("--no-cache",), ("up", "--nats-max-payload"): ("--no-cache",),  # the embedded server's
    ("up", "--demo-duration"): ("--demo", "--nats-url", "nats://127.0.0.1:1", "--no-cache"),
    ("up", "--rate-burst"): ("--rate-limit", "1", "--nats-url", "nats://127.0.0.1:1", "--no-cache"),
    ("up", "--client-rate-burst"): ("--client-rate-limit", "1", "--nats-url", "nats://127.0.0.1:1", "--no-cache"),
    **{("up", f"--l2-{o}"): ("--nats-url", "nats://127.0.0.1:1", "--redis-url", "redis://127.0.0.1:1")
       for o in ("timeout-ms", "pool-size", "breaker-failures", "breaker-open-s")},
    **{("up", o): ("--metrics-port", "0", "--nats-url", "nats://127.0.0.1:1", "--no-cache")
       for o in ("--http-idle-timeout-s", "--http-max-connections", "--http-processes")},
    **{("cluster up", o): ("--metrics-port", "0") for o in ("--http-idle-timeout-s", "--http-max-connections",
                                                           "--http-processes")},
    ("chaos run", "--fault-every"): ("soak",), ("chaos run", "--hang-s"): ("worker-hang",),
    ("chaos run", "--latency-ms"): ("gateway-degrade",), ("chaos run", "--drop-pct"): ("gateway-degrade",),
    ("chaos run", "--fault-at"): ("region-failover",), ("chaos run", "--fault-s"): ("gateway-degrade",),
    ("chaos run", "--down-s"): ("nats-node-loss",),
}
_COMMAND_ARGS = {  # each command's required arguments, and a NATS nothing listens at (port 1) where it connects
    "up": ("--nats-url", "nats://127.0.0.1:1", "--no-cache"), "infer": ("digits", "-i", "a=b.npy"),
    "bench": ("digits", "--nats-url", "nats://127.0.0.1:1", "--concurrency", "1"), "chaos run": ("worker-crash",),
    "region manager": ("Z",), "region promote": ("A",), "models load": ("digits", "1"),
    "models unload": ("digits", "1"), "models default": ("digits", "1"),
    **{f"cluster {c}": (*sites, "--cluster", "{tmp}") for c, sites in (("kill", ("A",)), ("restore", ("A",)),
                                                                        ("isolate", ("A",)), ("heal", ()),
                                                                        ("partition", ("A", "B")))},
}
_NO_RANGE = {  # number options whose rule is no range with two ends, each said in its help
    ("cluster up", "--witness-servers"): "3 or 5", ("cluster config", "--witness-servers"): "3 or 5",
    ("up", "--forget-after-s"): "in (--health-timeout-s, 86400], or inf: never",
    ("region manager", "--suspect-ms"): "in (0, --lease-ms]",
    ("cluster up", "--base-port"): "in [1, 65536 - the ports it takes]",
    ("cluster config", "--base-port"): "in [1, 65536 - the ports it takes]",
    ("cluster up", "--metrics-port"): "in [1, 65536 - --regions]",
}
_INTERVAL = re.compile(r"([\[(])(-?[\d,.]+), (-?[\d,.]+)\]")


def _refusal_of(path, option, value, tmp_path) -> subprocess.CompletedProcess:
    """``inferbus <path> ... <option> <value>``, run in this process (``inferbus.cli._run_app``, what the ``inferbus``
    command runs, with ``sys.argv``, the working folder, ``COLUMNS`` and both streams swapped for the call): a
    refusal is parsing alone, and the ~240 refusals of the walk below cost 0.5 s each as processes (two minutes of
    the suite). An option that is not checked fails its test: the command then goes on to connect to a NATS
    nothing listens at (port 1), or the module's timeout stops it."""
    command = " ".join(path)
    _cluster_file(tmp_path / "cluster.json", "nats://127.0.0.1:1")
    args = [a.format(tmp=tmp_path) for a in _NEEDS.get((command, option), _COMMAND_ARGS.get(command, ()))]
    if path[0] in ("infer", "health", "nodes", "models", "region") and "--nats-url" not in args:
        args += ["--nats-url", "nats://127.0.0.1:1"]
    if path[0] in ("up", "chaos") or command == "cluster up":
        args += ["--run-dir", str(tmp_path / "run")]
    if command == "cluster config":
        args += ["--out", str(tmp_path / "cfg")]
    return cli_in_process([*path, *args, option, value], cwd=tmp_path)


def _help_of(path, option) -> str:
    import typer

    from inferbus.cli import app

    cmd = typer.main.get_command(app)
    for word in path:
        cmd = cmd.commands[word]
    return next(p.help for p in cmd.params if option in p.opts)


@pytest.mark.parametrize("path,option,kind,required", NUMBER_OPTIONS,
                         ids=[f"{' '.join(p)} {o}" for p, o, _, _ in NUMBER_OPTIONS])
def test_every_number_option_has_a_range_its_help_and_its_refusal_name_alike(path, option, kind, required, tmp_path):
    """Every integer or number option of every command has an upper bound (``up --rate-limit 1e300``,
    ``--max-pending 99999999999999999999``, ``--chunk-rows``, ``region manager --initial-wait-ms -1`` were taken),
    and its help names its range as its refusal does, in interval notation (help said ``0 to 1024`` where the
    refusal said ``[0, 1024]``): a value past the upper end is refused, one line, exit 2, with the same interval."""
    command = " ".join(path)
    help_text = " ".join(_help_of(path, option).split())
    huge = "99999999999999999999" if kind is int else "1e300"
    p = _refusal_of(path, option, huge, tmp_path)
    assert p.returncode == 2 and p.stderr.startswith(f"error: {command}: {option} must be "), (p.returncode,
                                                                                              p.stderr[-800:])
    assert p.stderr.count("\n") == 1 and not p.stdout, (p.stdout[-500:], p.stderr[-800:])
    if (command, option) in _NO_RANGE:
        assert _NO_RANGE[command, option] in help_text, help_text
        return
    m = _INTERVAL.search(help_text)
    assert m, f"{command} {option}: its help names no range in interval notation: {help_text}"
    assert m.group(0) in p.stderr, (m.group(0), p.stderr)
    hi = float(m.group(3).replace(",", ""))
    above = str(int(hi) + 1) if kind is int else f"{hi * 1.5 + 1:g}"
    p = _refusal_of(path, option, above, tmp_path)
    assert p.returncode == 2 and m.group(0) in p.stderr, (above, m.group(0), p.returncode, p.stderr[-800:])
    lo = float(m.group(2).replace(",", ""))
    below = str(int(lo) - 1) if kind is int else (f"{lo:g}" if m.group(1) == "(" else f"{lo - 0.5:g}")
    p = _refusal_of(path, option, below, tmp_path)
    assert p.returncode == 2 and p.stderr.startswith(f"error: {command}: {option} must be "), (below, p.stderr[-800:])


@pytest.mark.parametrize("argv,actor,said", [
    (["--log-format", "json", "--bogus"], "node-n1", "error: up: No such option: --bogus"),
    (["--log-format=json", "--node-id", "x9", "--workers", "abc"], "node-x9", "error: up: --workers must be an integer"),
    (["--node-id=z", "--nats-port", "", "--log-format", "json"], "node-z", "error: up: --nats-port"),
])
def test_up_in_json_mode_writes_the_option_parsers_refusals_as_records(argv, actor, said):
    """``up --log-format json``: a refusal of the option parser (an unknown option, a value of the wrong type: found
    before ``up`` reads its options) is one JSON record on stderr as ``up``'s own refusals are, exit 2; it was a text
    line. Without json it stays the text line."""
    import json

    p = cli("up", *argv)
    assert p.returncode == 2 and not p.stdout, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    record = json.loads(lines[0])
    assert (record["level"], record["logger"], record["actor"]) == ("error", "inferbus.up", actor), record
    assert record["msg"].startswith(said) and record["msg"].endswith("up --help)"), record
    text = cli("up", *[a for a in argv if "json" not in a and a != "--log-format"])
    assert_one_error_line(text, said[len("error: "):])
