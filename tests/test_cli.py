"""The `inferbus` command as a user runs it: one-line typed errors (no tracebacks), outputs printed intact."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inferbus.bus import free_port

from conftest import ROOT, cli_in_process, cli_startup_s, processes_naming, run_in_a_pty

pytestmark = pytest.mark.timeout(60)


CLI_ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}


def cli(*args, timeout=30, env=None):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", *args], capture_output=True, text=True,
                       timeout=timeout, env={**CLI_ENV, **(env or {})})
    return p, time.monotonic() - t0


def refused(*args, env=None) -> subprocess.CompletedProcess:
    """``inferbus *args`` as :func:`cli` runs it (an environment of ``CLI_ENV`` plus ``env`` alone), in this process
    (:func:`conftest.cli_in_process`), for a refusal: parsing alone, where a process costs ~0.5 s of imports. A
    refusal that does not come runs the command here: its test fails by its assertion, or by its timeout."""
    return cli_in_process(list(args), env={**CLI_ENV, **(env or {})})


@pytest.mark.parametrize("argv", [
    ("models", "--nats-url", "{url}"),
    ("health", "--nats-url", "{url}"),
    # the group's --nats-url applies to the subcommand (it used to go to the default 127.0.0.1:4222)
    ("models", "--nats-url", "{url}", "--prefix", "p", "default", "digits", "2"),
    ("models", "load", "digits", "--nats-url", "{url}"),
    ("region", "status", "--nats-url", "{url}"),
    ("region", "demote", "--nats-url", "{url}"),
    ("region", "promote", "A", "--nats-url", "{url}"),
    ("bench", "digits", "--nats-url", "{url}", "--concurrency", "1", "--duration", "1"),
], ids=lambda a: " ".join(x for x in a if x != "{url}" and not x.startswith("--") and x not in ("1", "2", "p")))
def test_unreachable_nats_is_one_line_naming_the_url_exit_3(argv):
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    p, _ = cli(*(a.format(url=url) for a in argv))
    assert p.returncode == 3, p
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cannot reach NATS at {url}: "), p.stderr


@contextlib.contextmanager
def silent_servers(n: int):
    """``n`` NATS URLs of TCP listeners that never accept nor speak: the kernel completes the connection, no INFO
    ever comes (a host that black-holes the protocol)."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(16)
            socks.append(s)
        yield [f"nats://127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("argv", [
    ("health",), ("models",), ("models", "load", "digits"), ("infer", "digits", "-i", "x={npy}"), ("region", "status"),
    ("region", "status", "--json"), ("region", "promote", "A"), ("region", "demote"),
], ids=lambda a: " ".join(x for x in a if not x.startswith(("-", "x=", "d", "A"))))
def test_the_nats_connect_counts_within_timeout_s(tmp_path, argv):
    """Three servers that accept TCP and never speak NATS, ``--timeout-s 1``: one line naming them and the budget,
    exit 3, about a second after start-up. The connect was outside the budget: 2 s per server (nats-py's own
    timeout), 6.8 s here, whatever --timeout-s said, and the line said only ``TimeoutError``."""
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    args = [a.format(npy=tmp_path / "x.npy") for a in argv]
    startup_s = cli_startup_s(*args, "--nats-url", "{url}", "--timeout-s", "1", env=CLI_ENV)
    with silent_servers(3) as urls:
        p, took_s = cli(*args, "--nats-url", ",".join(urls), "--timeout-s", "1")
    assert p.returncode == 3, p
    assert p.stderr == f"cannot reach NATS at {', '.join(urls)}: not connected within the command's --timeout-s " \
                       f"(1 s)\n", p.stderr
    if "--json" in argv:
        assert json.loads(p.stdout)["error"]["code"] == "UNAVAILABLE", p.stdout
    # the budget plus slack for a shared, noisy host, over the start-up measured just before; below 3 servers x 2 s
    assert took_s - startup_s < 1 + 2.5, (took_s, startup_s)


def test_one_silent_server_is_given_up_on_within_timeout_s_in_the_same_words():
    """One silent server: nats-py's own connect timeout (set to the budget) and the budget end together; whichever
    comes first, the same line (nats-py's said only ``TimeoutError``)."""
    startup_s = cli_startup_s("health", "--nats-url", "{url}", "--timeout-s", "1", env=CLI_ENV)
    with silent_servers(1) as (url,):
        p, took_s = cli("health", "--nats-url", url, "--timeout-s", "1")
    assert (p.returncode, p.stdout) == (3, ""), p
    assert p.stderr == f"cannot reach NATS at {url}: not connected within the command's --timeout-s (1 s)\n", p.stderr
    assert took_s - startup_s < 1 + 2.5, (took_s, startup_s)


def test_servers_that_fail_differently_are_each_named_with_their_cause():
    """A silent server and a refused port: the line names each server's cause (it gave only the last one tried,
    so a refused port could hide that the other one black-holes the protocol; a fresh-user trial)."""
    dead_port = free_port()
    dead = f"nats://127.0.0.1:{dead_port}"
    with silent_servers(1) as (silent,):
        p, _ = cli("health", "--nats-url", f"{silent},{dead}", "--timeout-s", "3")
    assert (p.returncode, p.stdout) == (3, ""), p
    head = f"cannot reach NATS at {silent}, {dead}: "
    assert p.stderr.startswith(head) and p.stderr.count("\n") == 1, p.stderr
    causes = sorted(p.stderr[len(head):].rstrip("\n").split("; "), key=lambda c: not c.startswith(silent[7:]))
    assert len(causes) == 2 and causes[0] == f"{silent[7:]}: not connected within 2 s per server (TimeoutError)" \
        and causes[1].startswith(f"127.0.0.1:{dead_port}: [Errno 111] "), causes


def test_a_password_in_nats_url_is_not_printed_back():
    """A fresh-user trial: ``--nats-url nats://u:wrong@h:p`` was printed back whole in "cannot reach NATS at ..."."""
    port = free_port()
    p, _ = cli("health", "--nats-url", f"nats://u:s3cret@127.0.0.1:{port}", "--timeout-s", "2")
    assert p.returncode == 3 and "s3cret" not in p.stderr, p
    assert p.stderr.startswith(f"cannot reach NATS at nats://u:***@127.0.0.1:{port}: "), p.stderr


def test_a_budget_too_short_for_a_connect_says_it_may_be_the_budget_not_the_server(nats_server):
    """A fresh-user trial: ``health --timeout-s 0.001`` against a live server said only "cannot reach NATS ... not
    connected within the command's --timeout-s (0.001 s)", read as the server being down; under 0.1 s the line says
    the budget may be what ran out (still exit 3: nothing was reached). 1 s: the line as it was, no such clause."""
    p, _ = cli("health", "--nats-url", nats_server.url, "--timeout-s", "0.000001")  # (no connect is that quick)
    assert (p.returncode, p.stdout) == (3, ""), p
    assert p.stderr == (f"cannot reach NATS at {nats_server.url}: not connected within the command's --timeout-s "
                        f"(1e-06 s); a connect takes a few ms or more, so with a --timeout-s under 0.1 s the budget "
                        f"may be what ran out, not the server\n"), p.stderr
    with silent_servers(1) as (url,):
        p, _ = cli("health", "--nats-url", url, "--timeout-s", "0.1")
    assert p.returncode == 3 and "the budget may be what ran out" not in p.stderr, p


def test_the_request_gets_what_the_connect_left_of_timeout_s(nats_server):
    """Two silent servers before a live one (tried in the order given), ``health --timeout-s 4.5``: the connect takes
    2 s per silent server, and the probe (no ingress answers on this NATS) only what is left of the 4.5 s, not 4.5 s
    more: exit 1 about 4.5 s after start-up (it was 4 + 4.5 s)."""
    startup_s = cli_startup_s("health", "--nats-url", "{url}", "--timeout-s", "4.5", env=CLI_ENV)
    with silent_servers(2) as urls:
        p, took_s = cli("health", "--nats-url", ",".join([*urls, nats_server.url]), "--timeout-s", "4.5")
    assert p.returncode == 1, p
    assert p.stderr.startswith(("UNAVAILABLE: ", "DEADLINE_EXCEEDED: ")) and p.stderr.count("\n") == 1, p.stderr
    assert took_s - startup_s < 4.5 + 2.0, (took_s, startup_s)  # as above; it was 8.5 s over the start-up


@pytest.mark.parametrize("argv,says", [
    (("models", "unload", "digits"), "unload needs a version"),
    (("models", "default", "digits"), "default needs a version"),
    (("models", "default", "digits", "1", "--version", "2"), "two different versions"),
    (("models", "load", "digits", "1", "--version", "2"), "two different versions"),
])
def test_a_models_write_without_one_version_is_a_usage_error_before_connecting(argv, says):
    """``unload`` and ``default`` take the version as the second argument or as ``--version``; none, or two
    different ones, is exit 2 naming the problem, before any connection (nothing listens at the URL)."""
    p = refused(*argv, "--nats-url", f"nats://127.0.0.1:{free_port()}")
    assert p.returncode == 2 and says in " ".join(p.stderr.split()), p.stderr
    assert "Traceback" not in p.stderr + p.stdout and "cannot reach NATS" not in p.stderr


@pytest.mark.parametrize("url", ["nats://127.0.0.1:99999", "nats://127.0.0.1:abc", "nats://:4333", "nats://[::1",
                                 "http://127.0.0.1:4333"])
def test_a_nats_url_that_is_no_url_is_one_line_exit_2_for_every_client_command(url):
    """It used to end in nats-py's traceback (``Port out of range``, ``invalid connect url option``), exit 1; then
    the SDK's ``INVALID_ARGUMENT: Client.connect: ...`` line, without the ``error: COMMAND:`` of every other usage
    error (a fresh-user trial, 2026-12-05). Now a usage error like the others, with ``--json`` too (nothing on
    stdout, as for any usage error). Every client command for the first URL; one plain and one ``--json`` command for
    the others (the commands share one URL check, and each is a process start: ~2 s on the 2-core box)."""
    first = url == "nats://127.0.0.1:99999"
    for argv in (("health",), ("models",), ("models", "load", "digits"), ("region", "status"),
                 ("region", "promote", "A"))[:None if first else 1]:
        p = refused(*argv, "--nats-url", url)
        assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, (argv, p)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {' '.join(argv[:2]) if len(argv) > 1 else argv[0]}: "
                                                       f"--nats-url {url!r}"), (argv, p.stderr)
    for argv in (("models", "load", "digits"), ("region", "status"), ("bench", "digits", "--concurrency", "1"))[
            :None if first else 1]:
        p = refused(*argv, "--nats-url", url, "--json")
        assert p.returncode == 2 and p.stdout == "" and f"--nats-url {url!r}" in p.stderr, (argv, p)


def test_the_sdk_refuses_a_nats_url_that_is_no_url_with_invalid_argument():
    import asyncio

    from inferbus.client import Client
    from inferbus.schemas import InvalidArgument

    for url in ("nats://127.0.0.1:99999", "nats://127.0.0.1:abc", "nats://:4333", "ftp://h:1", "a,nats://[::1"):
        with pytest.raises(InvalidArgument) as ei:
            asyncio.run(Client.connect(url))
        assert ei.value.field == "servers", url


@pytest.mark.timeout(120)
def test_sigterm_stops_a_self_started_bench_with_its_generators_and_node():
    """SIGTERM used to kill `inferbus bench` alone (exit -15): its generator kept running ~15 s and the node's
    run folder stayed. Now it stops as Ctrl-C does: exit 143, one line, nothing of its session left running."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "bench", "--workers", "1", "--concurrency", "4",
                          "--duration", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 90
    while True:  # until its load generator runs (the node is up and the steps have begun)
        ps = subprocess.run(["ps", "-s", str(p.pid), "-o", "args="], capture_output=True, text=True).stdout
        if "inferbus.loadgen" in ps:
            break
        assert p.poll() is None and time.monotonic() < deadline, ps
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err and "Traceback" not in err, err
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-s", str(p.pid), "-o", "args="], capture_output=True, text=True).stdout
    running = [line for line in ps.splitlines() if line.strip() and "<defunct>" not in line]  # exited, not reaped
    assert not running, f"left running: {running}"


def test_bad_input_files(tmp_path):
    p, _ = cli("infer", "digits", "-i", f"pixels={tmp_path / 'missing.npy'}")
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr
    junk = tmp_path / "junk.npy"
    junk.write_text("not numpy")
    p, _ = cli("infer", "digits", "-i", f"pixels={junk}")
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr
    # what is wrong with each, in our words: never numpy's advice to load pickled data
    assert "not a .npy file" in p.stderr and "pickle" not in p.stderr, p.stderr
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    p, _ = cli("infer", "digits", "-i", f"pixels={objects}")
    assert p.returncode == 2 and "holds Python objects" in p.stderr and "allow_pickle" not in p.stderr, p.stderr
    truncated = tmp_path / "truncated.npy"
    truncated.write_bytes(objects.read_bytes()[:20])
    p, _ = cli("infer", "digits", "-i", f"pixels={truncated}")
    assert p.returncode == 2 and "damaged .npy" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p, _ = cli("infer", "digits", "-i", f"pixels={tmp_path}")
    assert p.returncode == 2 and "Is a directory" in p.stderr, p.stderr
    # a fresh-user trial: a FIFO hung the open (no writer), a header claiming 23.8 GiB was a MemoryError traceback
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    p, _ = cli("infer", "digits", "-i", f"pixels={fifo}")
    assert (p.returncode, p.stderr.count("\n")) == (2, 1) and f"cannot read {fifo}: not a regular file" in p.stderr, \
        p.stderr
    huge = tmp_path / "huge.npy"
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (100_000_000, 64)})
    huge.write_bytes(head.getvalue() + bytes(16))
    p, _ = cli("infer", "digits", "-i", f"pixels={huge}")
    assert (p.returncode, p.stderr.count("\n")) == (2, 1) and "a damaged .npy file (its header says shape " \
        "(100000000, 64) of float32, 25600000000 bytes, and the file holds 16 after it)" in p.stderr, p.stderr


def test_infer_prints_nan_and_bytes_outputs_and_typed_errors(deployment, tmp_path):
    x = tmp_path / "nan.npy"
    np.save(x, np.full((1, 64), np.nan, np.float32))
    p, _ = cli("infer", "digits", "-i", f"pixels={x}", "--nats-url", deployment.nats_url)
    assert p.returncode == 0, p.stderr
    assert "nan" in p.stdout  # not swallowed as rich markup
    s = tmp_path / "s.npy"
    np.save(s, np.array([[b"abc"], [b"xy"]]))
    p, _ = cli("infer", "strings", "-i", f"s={s}", "--nats-url", deployment.nats_url)
    assert p.returncode == 0, p.stderr
    assert "abc" in p.stdout
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((1, 63), np.float32))
    p, _ = cli("infer", "digits", "-i", f"pixels={bad}", "--nats-url", deployment.nats_url)
    assert p.returncode == 2 and "INVALID_ARGUMENT" in p.stderr and "inputs[0].shape" in p.stderr
    # --json: the whole answer as one JSON object (the text form is numpy's print then JSON: a fresh-user trial),
    # non-finite floats as the wire writes them, BYTES as text; an error as the wire's error object
    p, _ = cli("infer", "digits", "-i", f"pixels={x}", "--nats-url", deployment.nats_url, "--json")
    assert p.returncode == 0, p.stderr
    ans = json.loads(p.stdout)
    assert ans["model_name"] == "digits" and ans["outputs"]["logits"]["shape"] == [1, 10], ans
    assert ans["outputs"]["logits"]["datatype"] == "FP32" and set(ans["outputs"]["logits"]["data"]) <= {"NaN"}, ans
    assert "timings_us" in ans["parameters"], ans
    p, _ = cli("infer", "strings", "-i", f"s={s}", "--nats-url", deployment.nats_url, "--json")
    out = next(iter(json.loads(p.stdout)["outputs"].values()))
    assert out["datatype"] == "BYTES" and any("abc" in str(v) for v in out["data"]), out
    p, _ = cli("infer", "digits", "-i", f"pixels={bad}", "--nats-url", deployment.nats_url, "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["error"]["field"] == "inputs[0].shape", p


def test_infer_lays_out_the_arrays_at_the_terminal_width(deployment, tmp_path):
    """numpy printed each output at its own 75 columns and the console broke those lines again at a narrower width:
    at COLUMNS=60 a row of ``logits`` came as three ragged lines, the middle one starting at column 0 with no
    bracket. Now numpy lays the rows out at the width: every line fits and each one after the first of an array
    starts indented, as numpy continues a row."""
    x = tmp_path / "x.npy"
    np.save(x, np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 64))
    for columns in (60, 40):
        p = subprocess.run([sys.executable, "-m", "inferbus.cli", "infer", "digits", "-i", f"pixels={x}",
                            "--nats-url", deployment.nats_url], capture_output=True, text=True, timeout=30, cwd=ROOT,
                           env={**os.environ, "COLUMNS": str(columns)})
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        i = lines.index(next(line for line in lines if line.startswith("logits ")))
        rows = []
        for line in lines[i + 1:]:
            rows.append(line)
            if line.endswith("]]"):
                break
        assert rows[0].startswith("[[") and len(rows) > 1, (columns, rows)
        assert all(len(line) <= columns for line in rows), (columns, rows)
        assert all(line.startswith("  ") for line in rows[1:]), (columns, rows)
        values = " ".join(rows).replace("[", " ").replace("]", " ").split()
        assert len(values) == 10, (columns, rows)


def cli_into_a_closed_pipe(*args, stream: str = "stdout", timeout=30) -> subprocess.CompletedProcess:
    """The command with ``stream`` (stdout or stderr) a pipe whose reader is already gone (``| head -c1`` that has
    exited: deterministic, where a live ``head`` may read everything before it goes); the other stream captured."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "inferbus.cli", *args], text=True, timeout=timeout,
                              env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
                              **({"stdout": w, "stderr": subprocess.PIPE} if stream == "stdout"
                                 else {"stdout": subprocess.PIPE, "stderr": w}))
    finally:
        os.close(w)


def test_output_into_a_closed_pipe_ends_quietly_with_141(deployment, tmp_path):
    """`inferbus infer ... | head -c1` exited 1 (Typer's and rich's handling of a broken pipe), as a failed request
    does. Now it ends as a Unix tool killed by SIGPIPE is reported: 141, nothing on stderr; for each way the
    commands write: rich's console (flushed each line), print() (buffered until the exit), typer.echo; and for a
    closed stderr (an error message that cannot be written)."""
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 64), np.float32))
    p, _ = cli("infer", "digits", "-i", f"pixels={x}", "--nats-url", deployment.nats_url)
    assert p.returncode == 0 and "probabilities" in p.stdout, p  # the same request with its output read
    for argv in (("infer", "digits", "-i", f"pixels={x}", "--nats-url", deployment.nats_url),
                 ("models", "--json", "--nats-url", deployment.nats_url),
                 ("chaos", "list")):
        p = cli_into_a_closed_pipe(*argv)
        assert (p.returncode, p.stderr) == (141, ""), (argv, p.returncode, p.stderr[-2000:])
    p = cli_into_a_closed_pipe("infer", "digits", "-i", f"pixels={tmp_path / 'missing.npy'}", stream="stderr")
    assert (p.returncode, p.stdout) == (141, ""), (p.returncode, p.stdout[-2000:])


def test_cluster_control_with_its_witness_unreachable_is_one_line_exit_3(tmp_path):
    url = f"nats://127.0.0.1:{free_port()}"
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"spec": {"regions": ["A", "B"], "witness": "W", "prefix": "x"}, "servers": {"W1": {"site": "W", "url": url}},
         "client_urls": [url]}))
    p, _ = cli("cluster", "kill", "B", "--cluster", str(tmp_path))
    assert p.returncode == 3 and "Traceback" not in p.stderr + p.stdout, p
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and p.stderr.startswith(f"cannot reach NATS at {url}: ")


def test_region_promote_of_a_region_without_a_manager_is_one_line_exit_1(nats_server):
    """No manager of region Z runs: the command ran and could not be carried out (exit 1), said in one line."""
    p, took_s = cli("region", "promote", "Z", "--nats-url", nats_server.url)
    assert p.returncode == 1, p
    assert "Traceback" not in p.stderr + p.stdout
    # starting "error: " as every error line of the CLI does (it had none)
    assert p.stderr.strip() == "error: region promote Z: no region manager of that region answers from here (no " \
                               "responders on its control subject: it is not running, or a partition cuts it off " \
                               "from this side)", p.stderr
    p, _ = cli("region", "demote", "Z", "--nats-url", nats_server.url)
    assert p.returncode == 1 and p.stderr.strip().startswith("error: region demote: no region manager"), p


@pytest.mark.parametrize("args", [("--concurrency", "0,-1"), ("--concurrency", "x"), ("--concurrency", "", "--rate", "0"),
                                  ("--concurrency", "", "--rate", ""), ("--duration", "0"),
                                  # options of the deployment bench starts itself, ignored with --nats-url before
                                  ("--workers", "2"), ("--ingress", "2", "--busy-poll-us", "5")])
def test_bench_bad_arguments_are_one_line_exit_2(args):
    """Checked before anything starts: one line, exit 2, no traceback (no deployment needed)."""
    p, took_s = cli("bench", "digits", "--nats-url", "nats://127.0.0.1:1", *args)
    assert p.returncode == 2, p
    assert "Traceback" not in p.stderr + p.stdout
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: bench: "), p.stderr


@pytest.mark.parametrize("args, said", [
    (("--suite", "--nats-url", "nats://127.0.0.1:1"), "--suite does not take --nats-url"),
    (("--suite", "--concurrency", "1", "--rate", "5", "--hit", "--json"),
     "--suite does not take --concurrency, --rate, --hit, --json"),
    (("--suite", "--prefix", "x", "--spread"), "--suite does not take --prefix, --spread"),
    (("--suite", "--workers", "0"), "--suite takes --workers 1 or more"),
    # refused in a load run's words and ranges before the suite's parser sees them (it took --duration 1e9)
    (("--suite", "--duration", "0"), "bench: --duration must be in (0, 86400] seconds"),
    (("--suite", "--timeout-s", "0"), "bench: --timeout-s must be in (0, 3600] seconds"),
    (("--suite", "--gens", "0"), "bench: --gens must be in [1, "),
    (("--out", "/tmp/inferbus-never-written.json"), "--out applies only with --suite"),
    (("--profile", "tiny", "--nats-url", "nats://127.0.0.1:1"), "--profile applies only with --suite"),
    (("--spread", "--concurrency", "1"), "--spread spreads the generators over the servers of --nats-url"),
    # the suite's argparse said it: "--profile: invalid choice: 'huge' (choose from 'full', 'quick', ...)"
    (("--suite", "--profile", "huge"), "bench: --profile must be one of full, quick, throughput, tiny, got 'huge'"),
])
def test_bench_options_that_do_not_apply_are_refused_not_ignored(args, said):
    """A fresh-user trial (2026-12-02): ``bench --out F`` without ``--suite`` wrote nothing and exited 0, and
    ``bench --suite --nats-url U`` benchmarked a deployment of its own. Each is one line, exit 2, before anything
    starts (no load, no file)."""
    p = refused("bench", *args)
    assert p.returncode == 2, p
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bench: ") and said in lines[0], p.stderr
    assert not Path("/tmp/inferbus-never-written.json").exists()


@pytest.mark.parametrize("env, said", [
    ({"INFERBUS_NATS_CREDS": "{missing}"}, "INFERBUS_NATS_CREDS {missing}: no such file"),
    ({"INFERBUS_NATS_NKEY_SEED": "{missing}"}, "INFERBUS_NATS_NKEY_SEED {missing}: no such file"),
    ({"INFERBUS_NATS_TLS_CA": "{missing}"}, "INFERBUS_NATS_TLS_CA {missing}: no such file"),
    ({"INFERBUS_NATS_TLS_CA": "{folder}"}, "INFERBUS_NATS_TLS_CA {folder}: is a folder"),
    ({"INFERBUS_NATS_TLS_CA": "{text}"}, "INFERBUS_NATS_TLS_CA {text}: not a CA certificate bundle (PEM)"),
    ({"INFERBUS_NATS_TLS_KEY": "{text}"}, "INFERBUS_NATS_TLS_KEY is the key of INFERBUS_NATS_TLS_CERT"),
    ({"INFERBUS_NATS_CREDS": "{text}"}, "INFERBUS_NATS_CREDS {text}: not a .creds file"),
    ({"INFERBUS_NATS_USER": "u"}, "INFERBUS_NATS_USER needs INFERBUS_NATS_PASSWORD"),
    ({"INFERBUS_NATS_PASSWORD": "p"}, "INFERBUS_NATS_PASSWORD needs INFERBUS_NATS_USER"),
])
@pytest.mark.parametrize("argv", [("health",), ("region", "status")])
def test_client_credentials_from_the_environment_are_checked_before_connecting(tmp_path, nats_server, env, said,
                                                                                argv):
    """A fresh-user trial (2026-12-02): ``INFERBUS_NATS_CREDS=/nonexist inferbus health`` printed a 109-line
    traceback, ``INFERBUS_NATS_TLS_CA=/nonexist`` said "cannot reach NATS" naming neither, and a user without a
    password was sent as given. As ``up`` checks its options: one line naming the variable, exit 2, against a
    server that is up (so it is not the connection that fails)."""
    text = tmp_path / "plain.txt"
    text.write_text("not a key\n")
    subs = {"{missing}": str(tmp_path / "none"), "{folder}": str(tmp_path), "{text}": str(text)}

    def fill(s):
        for k, v in subs.items():
            s = s.replace(k, v)
        return s

    p = refused(*argv, "--nats-url", nats_server.url, env={k: fill(v) for k, v in env.items()})
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: " + fill(said)), p.stderr


def test_bench_of_a_bytes_model_without_a_dataset_checks_its_answers(deployment):
    """``strings`` (BYTES in, BYTES out) ships no data/test.npz: the generator makes distinct UTF-8 inputs and
    judges the answers against ONNX Runtime fed the same text (it used to send ints and crash)."""
    p, _ = cli("bench", "strings", "--nats-url", deployment.nats_url, "--concurrency", "2", "--duration", "0.5",
               "--json", timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    (step,) = json.loads(p.stdout)
    assert step["requests"] > 0 and step["wrong"] == 0 and not step["errors"], step


def test_version_and_infer_argument_checks(tmp_path):
    p, _ = cli("--version")
    assert p.returncode == 0 and p.stdout.startswith("inferbus "), p
    a = tmp_path / "a.npy"
    np.save(a, np.zeros((1, 64), np.float32))
    for args, said in [(("-i", f"pixels={a}", "-i", f"pixels={a}"), "input 'pixels' given twice"),
                       (("-i", f"pixels={a}", "--timeout-s", "-1"), "--timeout-s must be in (0, 600] seconds, got -1"),
                       (("-i", f"pixels={a}", "--timeout-s", "inf"), "infer: --timeout-s must be in (0, 600] seconds"),
                       (("-i", f"pixels={a}", "--timeout-s", "nan"), "infer: --timeout-s must be in (0, 600] seconds")]:
        p, _ = cli("infer", "digits", *args, "--nats-url", "nats://127.0.0.1:1")  # refused before connecting
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p


@pytest.mark.parametrize("name,value", [("INFERBUS_JAX_TRANSFER", "zerocopy"), ("INFERBUS_CUDA_SCHEDULE", "bogus"),
                                        ("INFERBUS_CUDA_SCHEDULE", "")])
def test_up_refuses_a_bad_accelerator_environment_in_one_line_exit_2(name, value):
    """A bad INFERBUS_JAX_TRANSFER / INFERBUS_CUDA_SCHEDULE is refused before anything starts (it used to fail
    every worker's start with a ~190-line traceback)."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--nats-port", "0"], capture_output=True,
                       text=True, timeout=30, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", name: value})
    assert p.returncode == 2, p
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "one of" in lines[0], p.stderr
    assert time.monotonic() - t0 < 20


def test_up_notes_that_nats_cpus_without_pin_cpus_keeps_nothing_off_its_cores(tmp_path):
    """A fresh-user trial: ``--nats-cpus`` without ``--pin-cpus`` left the actors free to run on nats-server's cores
    without a word. Now a note says so (here before a bad option stops the start: nothing runs)."""
    core = min(os.sched_getaffinity(0))
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--nats-cpus",
                        str(core), "--mailbox-size", "0", "--run-dir", str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=30, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 2 and "up: --mailbox-size must be in [1, " in p.stderr, p.stderr
    assert f"note: --nats-cpus keeps nats-server on core {core}, but the actors are not pinned" in p.stderr


@pytest.mark.parametrize("args,said", [
    (("--models", "/nonexistent-inferbus-models"), "is not a folder"),
    (("--nats-port", "99999"), "up: --nats-port must be in [0, 65535] (0 = any free port), got 99999"),
    (("--default-timeout-ms", "-1"), "--default-timeout-ms must be in (0, 600000]"),
    (("--default-timeout-ms", "nan"), "--default-timeout-ms must be in (0, 600000]"),
    (("--default-timeout-ms", "1e99"), "--default-timeout-ms must be in (0, 600000]"),
    (("--redis-url", "foo://x"), "--redis-url must start with redis://"),
    (("--prefix", "a b"), "prefix"),
    (("--max-request-bytes", "-1"), "up: --max-request-bytes must be in [0, 8,388,608] bytes (at most "
                                    "--nats-max-payload, the embedded nats-server's largest message; 0 = that size), got -1"),
    # with another NATS (its max_payload is not known before connecting) nats-server's ceiling
    (("--nats-url", "nats://127.0.0.1:1", "--max-request-bytes", "-1"),
     "up: --max-request-bytes must be in [0, 67,108,864] bytes (0 = the bus's max_payload; nats-server's ceiling), "
     "got -1"),
    # the node's checks name configuration fields; the message names the options the user typed instead
    (("--hedge-budget", "2"), "up: --hedge-budget must be in [0, 1], got 2"),
    (("--mailbox-size", "0"), "up: --mailbox-size must be in [1, 1,000,000,000] requests, got 0"),
    (("--rate-limit", "-1"), "up: --rate-limit must be in [0, 1,000,000,000] requests/s (0 = off), got -1"),
    (("--client-rate-limit", "-1"), "up: --client-rate-limit must be in [0, 1,000,000,000] requests/s"),
    # no upper bound: 1e300 requests/s was a limit that limits nothing (0 is "off")
    (("--rate-limit", "1e300"), "up: --rate-limit must be in [0, 1,000,000,000] requests/s (0 = off), got 1e+300"),
    (("--rate-limit", "1", "--rate-burst", "0.5"), "up: --rate-burst must be 0 (one second of the rate) or in "
                                                   "[1, 1,000,000,000] requests, got 0.5"),
    (("--max-error-rate", "2"), "up: --max-error-rate must be in [0, 1], got 2"),
    # a check of several options named them all, not which one was wrong, nor the value given
    (("--min-window-requests", "0"), "up: --min-window-requests must be in [1, 1,000,000,000] requests, got 0"),
    (("--l2-pool-size", "0"), "up: --l2-pool-size must be in [1, 10000] connections (Valkey's default maxclients), "
                              "got 0"),
    (("--max-tensor-bytes", "-1"), "up: --max-tensor-bytes must be in [0, 536,870,912] bytes (0 = no limit; the most "
                                   "values a request carries), got -1"),
    (("--max-bytes-elements", "-1"), "up: --max-bytes-elements must be in [0, 67,108,864] elements (0 = no limit), "
                                     "got -1"),
    # no upper bounds: a 20-digit count was taken
    (("--max-pending", "99999999999999999999"), "up: --max-pending must be in [1, 1,000,000,000] requests, got "
                                                "99999999999999999999"),
    (("--chunk-rows", "99999999999999999999"), "up: --chunk-rows must be an integer in [0, 2,147,483,647] rows"),
    (("--max-backlog-bytes", "0"), "up: --max-backlog-bytes must be in [1, 67,108,864] bytes"),
    (("--inline-max-compute-us", "-5"), "up: --inline-max-compute-us must be in [0, 1,000,000] µs"),
    (("--chunk-rows", "-1"), "up: --chunk-rows must be an integer in [0, 2,147,483,647] rows (0: never split)"),
    # a max_payload nats-server refuses (over 64 MiB), or one so small the node would never get ready
    (("--nats-max-payload", "5"), "up: --nats-max-payload must be in [65536, 67,108,864] bytes (64 KiB to 64 MiB"),
    (("--nats-max-payload", str(128 * 1024 * 1024)), "up: --nats-max-payload must be in [65536, "),
    # NaN passed every "x <= 0" check (each comparison with NaN is false) and started a node; infinity is no time
    (("--health-timeout-s", "nan"), "up: --health-timeout-s must be in [0.5, 86400] seconds (at least five of the "
                                    "workers' 100 ms load-report periods: under it every worker reads as silent), got nan"),
    (("--health-timeout-s", "inf"), "up: --health-timeout-s must be in [0.5, 86400] seconds"),
    # a fresh-user trial: 1e-9 (seconds typed as if ms) hung the start 60 s, then said only "not ready"
    (("--health-timeout-s", "1e-9"), "up: --health-timeout-s must be in [0.5, 86400] seconds"),
    (("--health-timeout-s", "0.49"), "up: --health-timeout-s must be in [0.5, 86400] seconds"),
    (("--health-timeout-s", "1e300"), "up: --health-timeout-s must be in [0.5, 86400] seconds"),
    # a worker is judged silent (its requests failed) before it is forgotten
    (("--forget-after-s", "5"), "up: --forget-after-s must be in (5, 86400] seconds (more than --health-timeout-s), "
                                "or inf (never), got 5"),
    (("--forget-after-s", "nan"), "up: --forget-after-s must be in (5, 86400] seconds (more than --health-timeout-s)"),
    (("--forget-after-s", "1e300"), "up: --forget-after-s must be in (5, 86400] seconds"),
    (("--health-window-s", "nan"), "up: --health-window-s must be in [1, 86400] seconds"),
    (("--health-window-s", "1e308"), "up: --health-window-s must be in [1, 86400] seconds"),
    (("--mailbox-size", "99999999999999999999"), "up: --mailbox-size must be in [1, 1,000,000,000] requests"),
    (("--demo", "--demo-duration", "nan"), "up: --demo-duration must be in (0, 3600] seconds, got nan"),
    (("--prefix", "max_pending bad"), "up: --prefix must be dot-separated tokens of letters, digits, '_' or '-', "
                                      "got 'max_pending bad'"),
    # `--nats-token "$TOKEN"` with TOKEN unset served with no authentication at all (a fresh-user trial)
    (("--nats-token", ""), "up: --nats-token (or INFERBUS_NATS_TOKEN) is empty: give the secret, or leave"),
    (("--nats-user", "u", "--nats-password", " "), "up: --nats-password (or INFERBUS_NATS_PASSWORD) is empty"),
    (("--breaker-open-s", "nan"), "up: --breaker-open-s must be in (0, 86400] seconds, got nan"),
    (("--inline-max-compute-us", "nan"), "up: --inline-max-compute-us must be in [0, 1,000,000] µs"),
    (("--peer-query-timeout-ms", "inf"), "up: --peer-query-timeout-ms must be in (0, 600000] ms"),
    # --l2-timeout-ms had no check at all
    (("--l2-timeout-ms", "-1"), "up: --l2-timeout-ms must be in (0, 600000] ms (a request's longest budget), got -1"),
    (("--l2-timeout-ms", "nan"), "up: --l2-timeout-ms must be in (0, 600000] ms"),
    (("--l2-breaker-failures", "0"), "up: --l2-breaker-failures must be in [1, 1,000,000,000] failures, got 0"),
    # a deployment on 'inferbus' answered this one's requests (its <p>.ingresses.<id>.infer.> matched them)
    (("--prefix", "inferbus.ingresses.n1-i0"), "up: --prefix 'inferbus.ingresses.n1-i0' has the token 'ingresses', "
                                               "which inferbus puts after a prefix: a deployment on prefix 'inferbus'"),
    (("--l2-breaker-open-s", "inf"), "up: --l2-breaker-open-s must be in (0, 86400] seconds, got inf"),
    # a huge count kept inferbus up busy starting processes
    (("--ingress", "99999999999999999999"), "up: --ingress must be in [1, 1024], got 99999999999999999999"),
    (("--workers", "5000"), "up: --workers must be in [0, 1024] (0 = one per core), got 5000"),
    # an empty list was taken as the default backend without a word
    (("--backends", ","), "up: --backends ',' names no backend; give one or more of onnxruntime, jax, tensorrt"),
    (("--backends", " , "), "up: --backends ' , ' names no backend"),
    (("--backends", "onnxruntime,onnxruntime"), "up: --backends 'onnxruntime,onnxruntime' names onnxruntime more "
                                                "than once"),  # was a SpecError traceback (duplicate child id)
    # a request limit the embedded nats-server's max_payload never lets a request reach was accepted silently
    (("--nats-max-payload", "65536", "--max-request-bytes", "65537"),
     "up: --max-request-bytes must be in [0, 65536] bytes (at most --nats-max-payload, the embedded nats-server's "
     "largest message; 0 = that size), got 65537"),
    # valid: equal to it, or another NATS's (whose max_payload is not known before connecting); each gets past
    # that check to the next bad option, so nothing is started either
    (("--nats-max-payload", "65536", "--max-request-bytes", "65536", "--mailbox-size", "0"),
     "up: --mailbox-size must be in [1, "),
    (("--nats-url", "nats://127.0.0.1:1", "--max-request-bytes", str(64 * 1024 * 1024), "--mailbox-size", "0"),
     "up: --mailbox-size must be in [1, "),
    # --json that cannot be written ran the whole demo first, then ended in a FileNotFoundError /
    # IsADirectoryError traceback
    (("--nats-port", "0", "--demo", "--demo-duration", "0.2", "--json", "/nonexistent-inferbus/dir/x.json"),
     "up: --json /nonexistent-inferbus/dir/x.json: its folder /nonexistent-inferbus/dir does not exist"),
    (("--nats-port", "0", "--demo", "--demo-duration", "0.2", "--json", "/tmp"),
     "up: --json /tmp: is a folder; give a file name"),
    (("--nats-port", "0", "--demo", "--json", f"{ROOT}/README.md/x.json"), f"up: --json {ROOT}/README.md/x.json: "
                                                                          f"{ROOT}/README.md is not a folder"),
    # a --run-dir that is a file, or cannot be made, was a FileExistsError / PermissionError traceback
    (("--nats-port", "0", "--run-dir", f"{ROOT}/README.md"), f"up: --run-dir {ROOT}/README.md: exists and is not "
                                                              f"a folder"),
    (("--nats-port", "0", "--run-dir", "/proc/inferbus-no/run"), "up: --run-dir /proc/inferbus-no/run: cannot make "
                                                                  "the folder"),
    # a credential or TLS file that is missing or not what it should be was a traceback after the embedded
    # nats-server had started
    (("--tls-cert", "/nonexistent-inferbus.pem"), "up: --tls-cert /nonexistent-inferbus.pem: no such file"),
    (("--nats-creds", "/nonexistent-inferbus.creds"), "up: --nats-creds /nonexistent-inferbus.creds: no such file"),
    (("--nats-creds", f"{ROOT}/README.md"), "not a .creds file"),
    (("--nats-nkey-seed", f"{ROOT}/README.md"), "not an NKey seed"),
    (("--tls-key", f"{ROOT}/README.md"), "up: --tls-key is the key of --tls-cert; give the certificate too"),
    (("--tls-cert", f"{ROOT}/README.md"), f"up: --tls-cert {ROOT}/README.md: not a certificate and its private key"),
    (("--tls-ca", f"{ROOT}/README.md"), f"up: --tls-ca {ROOT}/README.md: not a CA certificate bundle (PEM)"),
    (("--tls-key", "/nonexistent-inferbus.key"), "up: --tls-key is the key of --tls-cert; give the certificate too"),
    # a user without a password (or the reverse) ended in "cannot reach NATS at None" after starting the server
    (("--nats-user", "u"), "up: --nats-user needs --nats-password"),
    (("--nats-password", "p"), "up: --nats-password needs --nats-user"),
    # options that cannot apply together were accepted, one of them ignored without a word
    (("--json", "/tmp/inferbus-no-demo.json"), "up: --json writes the demo's results and needs --demo"),
    (("--colocate", "--ingress", "2"), "up: --ingress 2 does not apply with --colocate"),
    (("--redis-url", "redis://127.0.0.1:1"), "up: --no-cache turns the L2 cache off, so --redis-url (or "
                                             "INFERBUS_REDIS_URL) cannot apply"),
    # a password's '@' not percent-encoded sent redis-py to a host named by a piece of the password (a trial)
    (("--redis-url", "redis://:s3cr:t@p/w%d@127.0.0.1:6571/0"), "up: --redis-url (or INFERBUS_REDIS_URL) has an '@' "
                                                                "after its host: a password with reserved"),
    (("--l2-lookup",), "up: --no-cache turns the L2 cache off, so --l2-lookup cannot apply"),
    (("--no-l2-lookup", "--mailbox-size", "0"), "up: --mailbox-size must be in [1, "),  # agrees with --no-cache: past it
    (("--l2-pool-size", "5", "--l2-timeout-ms", "5"), "up: --no-cache turns the L2 cache off, so --l2-pool-size and "
                                                      "--l2-timeout-ms cannot apply"),
    (("--demo-duration", "5"), "up: --demo-duration is the demo's step length and needs --demo"),
    (("--nats-url", "nats://127.0.0.1:1", "--nats-port", "4333"), "up: --nats-port configures the embedded "
                                                                  "nats-server, which --nats-url replaces"),
    (("--nats-url", "nats://127.0.0.1:1", "--nats-max-payload", "65536", "--nats-port", "0"),
     "up: --nats-port and --nats-max-payload configure the embedded nats-server"),
    # in the form of every refusal, "--option must be ..., got ..." (they were "--nats-cpus: a CPU list expected")
    (("--nats-cpus", "999999"), "up: --nats-cpus must be cores this process may run on ("),
    (("--nats-cpus", "3-1"), "up: --nats-cpus must be a CPU list whose ranges run from a core to a later one, got '3-1'"),
    (("--nats-cpus", "a"), "up: --nats-cpus must be a CPU list (e.g. 11-15 or 0,2,8-11), got 'a'"),
    (("--backends", "foo"), "up: --backends must each be one of onnxruntime, jax, tensorrt, got 'foo'"),
    (("--nats-url", "nats://127.0.0.1:1", "--nats-cpus", str(min(os.sched_getaffinity(0)))),
     "up: --nats-cpus places the embedded nats-server, and --nats-url replaces it"),
    (("--pin-cpus", "--nats-cpus", ",".join(map(str, sorted(os.sched_getaffinity(0))))),
     "up: --nats-cpus leaves no core for the pinned actors (--pin-cpus)"),
])
def test_up_refuses_bad_options_in_one_line_exit_2_before_starting_anything(tmp_path, args, said):
    """Each of these printed a long traceback and exited 1 (found by a fresh-user trial); the actors' own checks
    now run on the options before any server or process starts: one line, exit 2, nothing left running."""
    p = cli_in_process(["up", "--no-cache", "--workers", "1", "--run-dir", str(tmp_path / "run"), *args])
    assert p.returncode == 2, (p.stdout[-1500:], p.stderr[-1500:])
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], p.stderr
    assert not (tmp_path / "run" / "nats").exists()  # no embedded server was started


@pytest.mark.parametrize("args,said", [
    # an explicit --run-to-completion without --colocate was silently ignored: now a usage error naming --colocate
    (("--run-to-completion",), "up: --run-to-completion needs --colocate"),
    (("--run-to-completion", "--no-colocate"), "up: --run-to-completion needs --colocate"),
    # valid: each gets past that check to the next bad option (--nats-port), so nothing is started either
    (("--colocate", "--run-to-completion", "--nats-port", "99999"), "--nats-port must be in [0, 65535]"),
    (("--colocate", "--nats-port", "99999"), "--nats-port must be in [0, 65535]"),
    (("--nats-port", "99999"), "--nats-port must be in [0, 65535]"),  # the default (not given) needs no --colocate
    (("--no-run-to-completion", "--nats-port", "99999"), "--nats-port must be in [0, 65535]"),  # off: what runs anyway
])
def test_up_run_to_completion_needs_colocate(tmp_path, args, said):
    p = cli_in_process(["up", "--no-cache", "--workers", "1", "--run-dir", str(tmp_path / "run"), *args])
    assert p.returncode == 2, (p.stdout[-1500:], p.stderr[-1500:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert not (tmp_path / "run").exists()  # no server, no run folder


def _commands():
    """Every command and group of the CLI as (path, click command), the root first."""
    import typer

    from inferbus.cli import app

    todo = [((), typer.main.get_command(app))]
    while todo:
        path, cmd = todo.pop(0)
        yield path, cmd
        todo += [((*path, name), sub) for name, sub in getattr(cmd, "commands", {}).items()]


def _help_at_80_columns(*path: str) -> str:
    """``--help`` of ``path`` at 80 columns, piped: from :func:`_every_help_at`'s one process for every command (a
    process per command cost ~0.4 s each, 28 of them)."""
    out = _every_help_at(80)[path]
    assert max(len(line) for line in out.splitlines()) <= 80
    return out


def _listed_summaries(out: str) -> dict[str, list[str]]:
    """The Commands section of a group's ``--help`` (typer's rich panel or click's plain list): each command's name →
    the lines of its summary as printed (more than one where it wraps or where the text had line breaks)."""
    rows: dict[str, list[str]] = {}
    lines = out.splitlines()
    if any(line.startswith("╭─ Commands") for line in lines):  # rich: "│ name   summary   │", continued "│   more │"
        start = next(i for i, line in enumerate(lines) if line.startswith("╭─ Commands"))
        for line in lines[start + 1:]:
            if not line.startswith("│"):  # the panel's bottom edge
                break
            text = line[2:-1].rstrip()
            if text and not text[0].isspace():
                name, _, summary = text.partition(" ")
                rows[name] = [summary.strip()]
            elif text.strip():
                rows[list(rows)[-1]].append(text.strip())
        return rows
    start = lines.index("Commands:")  # click: "  name  summary", continued with a deeper indent
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if line.startswith("  ") and not line.startswith("   "):
            name, _, summary = line.strip().partition(" ")
            rows[name] = [summary.strip()]
        else:
            rows[list(rows)[-1]].append(line.strip())
    return rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", [path for path, cmd in _commands() if getattr(cmd, "commands", None)],
                         ids=lambda p: " ".join(p) or "(root)")
def test_every_command_summary_in_a_group_help_is_a_whole_phrase(path):
    """``inferbus --help`` (and each group's: cluster, region, models, chaos) listed summaries cut from the commands'
    docstrings: typer's rich panel kept the docstring's line breaks (``health  Ask one ingress ... answering
    within`` / ``--timeout-s).``), click's plain list cut them at ~60 characters (``Serve models: embedded
    nats-server + Valkey, supervisor,...``). Each command and group now has a one-line summary of its own
    (``short_help``), printed whole, on one line where there is room, at 100 and 200 columns, rich or plain."""
    group = dict(_commands())[path]
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "TYPER_USE_RICH")}
    for columns in (100, 200):
        for rich in (True, False):
            p = subprocess.run([sys.executable, "-m", "inferbus.cli", *path, "--help"], capture_output=True,
                               text=True, timeout=30, cwd=ROOT,
                               env={**env, "COLUMNS": str(columns), **({} if rich else {"TYPER_USE_RICH": "0"})})
            assert p.returncode == 0, p.stderr[-1500:]
            listed = _listed_summaries(p.stdout)
            assert set(listed) == {n for n, c in group.commands.items() if not c.hidden}, (columns, rich, listed)
            for name, lines in listed.items():
                summary = " ".join(lines)
                said = (columns, "rich" if rich else "plain", name, lines)
                assert summary == group.commands[name].short_help, said  # its own summary, whole
                assert len(lines) == 1, said  # one line: each fits in 100 columns
                assert summary.endswith(".") and not summary.endswith("..") and "\n" not in summary, said
                assert len(summary) <= 60, said  # a short phrase (click's plain list wraps past ~67 at 80 columns)


def _declared_options(cmd) -> set[str]:
    return {o for prm in cmd.params if not getattr(prm, "hidden", False) for o in (*prm.opts, *prm.secondary_opts)
            if o.startswith("--")}


def test_up_help_prints_every_option_name_in_full_at_80_columns():
    """rich's help table cut the widest option names to fit 80 columns (``--no-run-to-comple…``,
    ``--inline-max-comput…``): every option ``up`` declares must appear whole, as a name of its own."""
    up = dict(_commands())[("up",)]
    declared = _declared_options(up)
    assert {"--run-to-completion", "--no-run-to-completion", "--inline-max-compute-us", "--colocate"} <= declared
    out = _help_at_80_columns("up")
    shown = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", out))
    assert declared <= shown, sorted(declared - shown)
    assert "…" not in out


@pytest.mark.parametrize("path", [path for path, _ in _commands() if path != ("up",)],
                         ids=lambda p: " ".join(p) or "(root)")
def test_every_help_prints_every_option_name_in_full_at_80_columns(path):
    out = _help_at_80_columns(*path)
    shown = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", out))
    missing = _declared_options(dict(_commands())[path]) - shown
    assert not missing, sorted(missing)


_EVERY_HELP = """
import sys
import typer
from inferbus.cli import app
command = typer.main.get_command(app)
for path in {paths!r}:
    print("\\x00" + " ".join(path), flush=True)
    try:
        command.main([*path, "--help"], prog_name="inferbus", standalone_mode=False)
    except SystemExit:
        pass
    sys.stdout.flush()
"""


@functools.cache
def _every_help_at(columns: int) -> dict[tuple[str, ...], str]:
    """Every command's and group's ``--help`` laid out at ``columns`` (piped, ``COLUMNS`` set), from one process:
    path → its help. Made once per test process and width (its callers only read it)."""
    env = {k: v for k, v in os.environ.items() if k != "TERMINAL_WIDTH"}
    paths = [path for path, _ in _commands()]
    p = subprocess.run([sys.executable, "-c", _EVERY_HELP.format(paths=paths)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env={**env, "COLUMNS": str(columns)})
    assert p.returncode == 0, p.stderr[-1500:]
    parts = p.stdout.split("\x00")[1:]
    helps = {tuple(part.split("\n", 1)[0].split()): part.split("\n", 1)[1] for part in parts}
    assert list(helps) == paths
    return helps


@pytest.mark.parametrize("columns", [60, 80])
def test_every_help_shows_every_help_text_wrapped_not_cut_at_60_and_80_columns(columns):
    """A fresh-user trial: at 60 columns ``up --help`` printed no help text at all in its main panel (the long names,
    the ``--no-`` names and the types took every column), and from 62 to 78 columns cut them mid-word with ``…``
    (542 lines at 62, still ``[env var: INFERBUS_REDIS_UR…`` at 78); ``cluster up --help`` cut its too at 60. The
    ``--no-`` names now go below the option's name, in its column, and where the help texts would still be narrow
    the type goes there too: every help text is printed, wrapped in the width left, at 60 and 80 columns, for every
    command and group; no line is wider than the terminal."""
    from rich.text import Text

    for path, out in _every_help_at(columns).items():
        name = " ".join(path) or "(root)"
        assert "…" not in out, (name, [line for line in out.splitlines() if "…" in line])
        assert max(len(line) for line in out.splitlines()) <= columns, (name, out)
        # (typer padded the usage and description lines to the width with blanks: no line ends in any)
        assert not [line for line in out.splitlines() if line != line.rstrip()], (name, out)
        cmd = dict(_commands())[path]
        lines = [" ".join(line.split()) for line in out.splitlines()]
        for prm in cmd.params:  # each option's help text starts beside its name: its first words on one line
            if getattr(prm, "hidden", False) or not getattr(prm, "help", None):
                continue
            first = " ".join(Text.from_markup(prm.help).plain.split()[:2])
            assert any(first in line for line in lines), (name, prm.name, first, out)
        words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())  # the panels' text, one space between words
        for sub in getattr(cmd, "commands", {}).values():  # a group's command summaries, whole
            if not sub.hidden:
                assert " ".join(sub.short_help.split()) in words, (name, sub.name, out)


def _up_help_rows() -> dict[str, str]:
    """``up --help`` at 400 columns (one line per option): the first option name of each row → the row."""
    env = {k: v for k, v in os.environ.items() if k != "TERMINAL_WIDTH"}
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--help"], capture_output=True, text=True,
                       timeout=30, cwd=ROOT, env={**env, "COLUMNS": "400"})
    assert p.returncode == 0, p.stderr[-1500:]
    return {m.group(1): line for line in p.stdout.splitlines() if (m := re.match(r"│ (--[a-z0-9-]+) ", line))}


def test_up_help_states_the_range_each_check_allows():
    """Every ``up`` option with a checked range says it in its help, from the constants the checks use (there
    was none: --workers, --ingress, --nats-max-payload, --mailbox-size, ... were refused outside ranges the
    help did not give), in the interval notation of the refusals (``in [0, 1024]``; the help said ``0 to 1024``).
    tests/test_cli_usage_errors.py checks every number option of every command the same way against its refusal."""
    from inferbus._limits import (MAX_BACKLOG_BYTES, MAX_BACKLOG_MSGS, MAX_COUNT, MAX_HEALTH_WINDOW_S,
                                  MAX_MAILBOX_SIZE, MAX_MAX_PAYLOAD_BYTES, MAX_NODE_PROCESSES, MAX_PERIOD_S,
                                  MIN_MAX_PAYLOAD_BYTES, interval)
    from inferbus.bus._busypoll import MAX_WINDOW_US
    from inferbus.bus._headers import MAX_TIMEOUT_MS
    from inferbus.cli import MAX_DEMO_DURATION_S

    rows = _up_help_rows()
    for option, said in {
        "--workers": f"in {interval(0, MAX_NODE_PROCESSES)}", "--ingress": f"in {interval(1, MAX_NODE_PROCESSES)}",
        "--nats-max-payload": f"in {interval(MIN_MAX_PAYLOAD_BYTES, MAX_MAX_PAYLOAD_BYTES)} (64 KiB to 64 MiB)",
        "--mailbox-size": f"In {interval(1, MAX_MAILBOX_SIZE)}", "--health-window-s": f"in {interval(1, MAX_HEALTH_WINDOW_S)}",
        "--demo-duration": f"in {interval(0, MAX_DEMO_DURATION_S, lo_open=True)}",
        "--busy-poll-us": f"in {interval(0, MAX_WINDOW_US)}", "--nats-port": "in [0, 65535]",
        "--max-backlog-msgs": f"in {interval(1, MAX_BACKLOG_MSGS)}", "--max-backlog-bytes": f"in {interval(1, MAX_BACKLOG_BYTES)}",
        "--default-timeout-ms": f"in {interval(0, MAX_TIMEOUT_MS, lo_open=True)}",
        "--max-request-bytes": "at most --nats-max-payload", "--hedge-budget": "in [0, 1]", "--max-error-rate": "in [0, 1]",
        "--health-timeout-s": "in [0.5, 86400]", "--breaker-open-s": f"in {interval(0, MAX_PERIOD_S, lo_open=True)}",
        "--l2-timeout-ms": f"in {interval(0, MAX_TIMEOUT_MS, lo_open=True)}",
        "--min-window-requests": f"in {interval(1, MAX_COUNT)}", "--breaker-failures": f"in {interval(1, MAX_COUNT)}",
        "--max-pending": f"in {interval(1, MAX_COUNT)}", "--l2-pool-size": "in [1, 10000]",
        "--l2-breaker-failures": f"in {interval(1, MAX_COUNT)}", "--l2-breaker-open-s": f"in {interval(0, MAX_PERIOD_S, lo_open=True)}",
        "--rate-burst": f"or in {interval(1, MAX_COUNT)}", "--client-rate-burst": f"or in {interval(1, MAX_COUNT)}",
        "--forget-after-s": f"in (--health-timeout-s, {MAX_PERIOD_S}], or inf",
    }.items():
        assert said in rows[option], (option, rows[option])


def test_limits_hold_nats_py_pending_defaults():
    """``inferbus._limits`` writes nats-py's subscription pending limits out (so the CLI does not import nats-py for
    its help); ``--max-backlog-msgs/-bytes`` are bounded by half of them: they must be the installed nats-py's."""
    from nats.aio.subscription import DEFAULT_SUB_PENDING_BYTES_LIMIT, DEFAULT_SUB_PENDING_MSGS_LIMIT

    from inferbus import _limits

    assert _limits.NATS_SUB_PENDING_MSGS_LIMIT == DEFAULT_SUB_PENDING_MSGS_LIMIT
    assert _limits.NATS_SUB_PENDING_BYTES_LIMIT == DEFAULT_SUB_PENDING_BYTES_LIMIT


_COMMAND_ONLY_MODULES = (
    "asyncio", "numpy", "nats", "msgspec", "uvloop", "pydantic", "redis", "onnxruntime", "typer.rich_utils",
    "rich.markdown", "inferbus.accelerators", "inferbus.actors", "inferbus.bus", "inferbus.client",
    "inferbus.cluster", "inferbus.loadgen", "inferbus.model_admin", "inferbus.schemas", "inferbus.supervisor",
    "chaos", "bench")
"""What only some commands use, which ``import inferbus.cli`` (every command, ``--help``) must not load: asyncio,
nats-py, numpy, typer's rich help and its markdown, the bus, the actors, ... (~0.3 s of the CLI's start-up)."""


def test_cli_import_loads_only_what_every_command_needs():
    """``import inferbus.cli`` loaded numpy, nats-py, asyncio, the bus with the supervisor, the accelerators and
    typer's rich help for every command (~0.4 s; ~0.1 s without them): each command imports what it needs. And
    ``python -m inferbus.cli`` runs the module once, as ``inferbus.cli``, not first as ``__main__`` too; a client
    (the SDK, ``inferbus health``) does not load the embedded servers and the supervisor."""
    code = f"""
import atexit, json, runpy, sys

import inferbus.cli

loaded = sorted(m for m in {_COMMAND_ONLY_MODULES!r} if m in sys.modules)
import inferbus.client

client = sorted(m for m in ("inferbus.bus._embedded", "inferbus.supervisor") if m in sys.modules)
defined = vars(sys.modules["__main__"])  # what `python -m inferbus.cli` defines in __main__ (runpy's way)
atexit.register(lambda: print(json.dumps([loaded, client, sorted(k for k in ("app", "main", "up") if k in defined)])))
sys.argv = ["inferbus", "--version"]
runpy._run_module_as_main("inferbus.cli")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    version, said = p.stdout.strip().splitlines()
    assert version.startswith("inferbus "), p.stdout
    assert json.loads(said) == [[], [], []], said


def test_up_help_piped_is_at_least_100_columns_whatever_terminal_stdin_is_on():
    """Piped, rich laid the help out at the width of a terminal on stdin (or 80): on a 40-column one the option
    names and types took all of it and no help text was printed at all. Now at least 100 columns unless COLUMNS
    says otherwise (the 80-column tests above set it)."""
    import pty

    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "COLUMNS")}
    master, tty = pty.openpty()
    try:
        import fcntl
        import struct
        import termios

        fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
        for stdin in (tty, subprocess.DEVNULL):
            p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--help"], stdin=stdin,
                               capture_output=True, text=True, timeout=30, cwd=ROOT, env=env)
            assert p.returncode == 0, p.stderr[-1500:]
            assert max(len(line) for line in p.stdout.splitlines()) == 100, p.stdout
            assert "Model repository folder" in p.stdout and "CPU worker processes" in p.stdout, p.stdout
    finally:
        os.close(tty)
        os.close(master)


def test_health_with_no_ingress_answering_is_not_ready_exit_1(nats_server):
    """A NATS that answers but no ingress of that prefix: one line (UNAVAILABLE), exit 1 like "not ready", so a
    probe tells "down" from a usage error (exit 2), as the README's exit statuses say."""
    p, took_s = cli("health", "--nats-url", nats_server.url, "--prefix", "nobodyhere")
    assert p.returncode == 1, p
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("UNAVAILABLE"), p.stderr


@contextlib.contextmanager
def _hung_ingress(url: str, prefix: str):
    """A subscriber on ``<prefix>.health`` and ``<prefix>.models`` that takes every request and never answers (an
    ingress hung holding it), on an event loop of its own thread, while the block runs."""
    import asyncio
    import threading

    import nats

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def swallow(msg) -> None:
        pass

    async def subscribe():
        nc = await nats.connect(url)
        for subject in (f"{prefix}.health", f"{prefix}.models"):
            await nc.subscribe(subject, cb=swallow)
        await nc.flush()
        return nc

    nc = asyncio.run_coroutine_threadsafe(subscribe(), loop).result(10)
    try:
        yield
    finally:
        asyncio.run_coroutine_threadsafe(nc.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_health_and_models_take_their_budget_from_timeout_s(nats_server):
    """A fresh-user trial: ``inferbus health`` had a fixed 1 s budget, too short for a probe of a loaded box, with no
    option. ``health`` and the ``models`` listing (the same one-request path) take ``--timeout-s``; the
    DEADLINE_EXCEEDED of an ingress that takes the request and never answers names the budget given, less the
    connect's share of it (a few ms here: the connect counts within --timeout-s)."""
    with _hung_ingress(nats_server.url, "hung"):
        for argv, budget_ms in ((("health",), 1000), (("health", "--timeout-s", "1.5"), 1500),
                                (("models", "--timeout-s", "1.5"), 1500), (("models", "--json", "--timeout-s", "1.5"),
                                                                          1500)):
            p, took_s = cli(*argv, "--nats-url", nats_server.url, "--prefix", "hung")
            assert p.returncode == 1 and "Traceback" not in p.stderr + p.stdout, (argv, p)
            said = re.compile(r"DEADLINE_EXCEEDED: no answer within (\d+) ms \(")
            if "--json" in argv:  # the wire's error object on stdout
                err = json.loads(p.stdout)["error"]
                assert err["code"] == "DEADLINE_EXCEEDED", err
                m = said.match(f"DEADLINE_EXCEEDED: {err['message']}")
            else:
                m = said.match(p.stderr)
            assert m and budget_ms - 300 < int(m[1]) <= budget_ms, (argv, p.stdout, p.stderr)
            assert took_s >= budget_ms / 1000, (argv, took_s)


@pytest.mark.parametrize("command", ["health", "models"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e300", "601", "600.0001", "600.000000001"])
def test_a_timeout_s_that_is_no_budget_is_one_line_exit_2_before_connecting(command, value):
    """The value is echoed as typed, in its shortest form: 600.0001 was "got 600" (formatted with :g), a refusal that
    named an allowed value; 601 and 0 were "got 601.0" and "got 0.0" (the float's repr; a fresh-user trial)."""
    p = refused(command, "--timeout-s", value, "--nats-url", "nats://127.0.0.1:1")  # nothing listens: exit 3 there
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    if 600 < float(value) < float("inf"):  # 1e300, a fresh-user trial: against a prefix nobody serves it retried for ever
        given = "1e+300" if value == "1e300" else value
        assert p.stderr == f"error: {command}: --timeout-s must be in (0, 600] seconds, got {given}\n", p.stderr
        return
    assert p.stderr == f"error: {command}: --timeout-s must be in (0, 600] seconds, got {value}\n", p.stderr


@pytest.mark.parametrize("argv,said", [
    (("chaos", "run", "worker-crash", "--duration", "0"), "chaos run: --duration must be in (0, 86400] seconds, "
                                                          "got 0"),
    (("chaos", "run", "worker-crash", "--min-availability", "2"), "chaos run: --min-availability "
                                                                  "must be in [0, 1] (a share of the requests), got 2"),
    (("nodes", "--wait-s", "601"), "nodes: --wait-s must be in (0, 600] seconds, got 601"),
    (("up", "--demo", "--demo-duration", "3601"), "up: --demo-duration must be in (0, 3600] seconds, "
                                                  "got 3601"),
    (("up", "--busy-poll-us", "-1"), "up: --busy-poll-us must be in [0, 1,000,000] µs (0 = off), got -1"),  # (it said
    (("up", "--busy-poll-us", "2e6"), "up: --busy-poll-us must be in [0, 1,000,000] µs (0 = off), got 2000000"),  # -1.0)
], ids=["chaos-duration", "min-availability", "nodes-wait-s", "demo-duration", "busy-poll-negative", "busy-poll-2e6"])
def test_every_refused_number_is_echoed_as_typed_not_as_a_float(argv, said):
    """The other refusals of a number echo it as --timeout-s's do (601, not 601.0); all before anything starts."""
    p = refused(*argv)
    assert p.returncode == 2 and p.stderr == f"error: {said}\n" and not p.stdout, p


def test_the_models_listings_timeout_s_before_a_write_is_refused_not_ignored():
    p, _ = cli("models", "--timeout-s", "5", "load", "digits", "--nats-url", "nats://127.0.0.1:1")
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    assert p.stderr == ("error: models load: --timeout-s is the listing's budget; give the write's after the "
                        "subcommand: inferbus models load ... --timeout-s SECONDS\n"), p.stderr


@pytest.mark.parametrize("option", ["--timeout-s", "--timeout"])
@pytest.mark.parametrize("value", ["0", "nan"])
def test_a_model_writes_budget_is_timeout_s_and_checked_before_connecting(option, value):
    """The writes named their budget ``--timeout`` where every other client command says ``--timeout-s``, and a
    budget of 0 or NaN reached the NATS connection; now ``--timeout-s`` (``--timeout`` kept as its older name) is
    checked first: one line, exit 2, nothing listening needed; the refusal names the option as typed (``--timeout 0``
    said ``--timeout-s must be ...``)."""
    p, _ = cli("models", "unload", "digits", "1", option, value, "--nats-url", "nats://127.0.0.1:1")
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    assert p.stderr == f"error: models unload: {option} must be in (0, 600] seconds, got {value}\n", \
        p.stderr


def test_region_status_without_a_manager_says_a_plain_node_runs_none(nats_server):
    p, _ = cli("region", "status", "--nats-url", nats_server.url)
    assert p.returncode == 1 and "Traceback" not in p.stderr + p.stdout, p
    assert "no region manager heard" in p.stderr and "a plain `inferbus up` runs none" in p.stderr, p.stderr
    assert p.stderr.startswith("UNAVAILABLE: no region manager heard: "), p.stderr  # typed, as health and infer print
    p, _ = cli("region", "status", "--nats-url", nats_server.url, "--json")  # for scripts: the wire's error object
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "UNAVAILABLE", p.stdout


def test_up_with_an_unreadable_model_artifact_is_one_line_naming_it_exit_2(tmp_path):
    """A corrupt ``<version>/model.onnx`` stops ``up`` before anything starts, naming the file (fail fast, as
    Triton's default --exit-on-error; it used to crash every actor mid-start with a long traceback)."""
    import shutil

    models = tmp_path / "models"
    shutil.copytree(ROOT / "models" / "digits", models / "digits")
    (models / "digits" / "2" / "model.onnx").write_bytes(b"not an onnx model")
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--models",
                        str(models), "--run-dir", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=30, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, (p.stdout[-1500:], p.stderr[-1500:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "digits/2/model.onnx" in lines[0] and "cannot be served" in lines[0], p.stderr
    assert not (tmp_path / "run" / "nats").exists()


@pytest.mark.parametrize("argv", [("health", "--prefix", ""), ("health", "--prefix", ">"), ("models", "--prefix", ""),
                                  ("bench", "digits", "--prefix", "", "--duration", "1")])
def test_a_bad_prefix_is_one_line_exit_2(argv):
    """Refused before connecting (the URL is unreachable, and the exit is 2, not 3): it used to be a traceback."""
    p, _ = cli(*argv, "--nats-url", f"nats://127.0.0.1:{free_port()}")
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--prefix" in lines[0], p.stderr
    # the documented form, naming the command and not the config class behind it (a fresh-user trial)
    assert lines[0].startswith(f"error: {argv[0]}: --prefix ") and "BusConfig" not in lines[0], p.stderr


@pytest.mark.parametrize("argv,named", [(("region", "promote", "a b"), "region promote: REGION must be a region "
                                                                      "name (letters, digits, '_' or '-'), got 'a b'"),
                                        (("region", "demote", "eu.west"), "region demote: REGION must be a region "
                                                                          "name (letters, digits, '_' or '-'), got "
                                                                          "'eu.west'"),
                                        (("region", "demote", "--to", "x>"), "region demote: --to must be a region "
                                                                             "name (letters, digits, '_' or '-'), "
                                                                             "got 'x>'")])
def test_a_region_name_that_is_no_subject_token_is_one_line_exit_2(argv, named):
    """Refused before connecting (the URL is unreachable: exit 2, not 3); ``promote 'a b'`` used to reach nats-py
    and end in ``BadSubjectError``, exit 1."""
    p, _ = cli(*argv, "--nats-url", f"nats://127.0.0.1:{free_port()}")
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    lines = p.stderr.strip().splitlines()
    assert lines == [f"error: {named}"], p.stderr  # (it said "region: REGION 'a b' is no region name", not its command)


def test_a_cluster_file_that_names_no_nats_urls_is_one_line_exit_2(tmp_path):
    """``region ... --cluster`` reads the NATS URLs from the cluster's run dir: a missing or foreign file is one
    line, exit 2 (was a boxed usage error, and a KeyError traceback for a JSON file without ``client_urls``)."""
    (tmp_path / "other.json").write_text('{"x": 1}')
    for path, what in ((tmp_path / "none", "No such file or directory"), (tmp_path / "other.json", "client_urls")):
        for argv in (("region", "status", "--json"), ("region", "promote", "eu")):
            p, _ = cli(*argv, "--cluster", str(path))
            assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "--cluster" in lines[0] and what in lines[0], p.stderr
            # the command first, as the region commands' other errors say it (it was "error: --cluster: ...")
            assert lines[0].startswith(f"error: {argv[0]} {argv[1]}: --cluster {path}: "), p.stderr


@pytest.mark.parametrize("argv", [("region", "status", "--json"), ("region", "promote", "eu"), ("region", "demote")])
def test_a_fifo_as_region_cluster_file_is_one_line_naming_it_exit_2(tmp_path, argv):
    """A named pipe as ``--cluster`` (or as the run dir's cluster.json) is refused without being opened (it read
    "no such file (FileNotFoundError ...)")."""
    os.mkfifo(tmp_path / "cluster.json")
    for given in (tmp_path / "cluster.json", tmp_path):
        p, _ = cli(*argv, "--cluster", str(given))
        assert (p.returncode, p.stdout) == (2, ""), p
        assert p.stderr.startswith(f"error: {argv[0]} {argv[1]}: --cluster {given}: cannot read "
                                   f"{tmp_path / 'cluster.json'}: not a regular file ") \
            and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize("argv", [("region", "status"), ("region", "status", "--json"), ("region", "promote", "A"),
                                  ("region", "demote")])
def test_a_region_command_given_both_nats_url_and_cluster_refuses_the_pair(tmp_path, argv):
    """``--nats-url`` won and ``--cluster`` was ignored without a word: refused as other options that cannot apply
    together are, one line, exit 2, before connecting (nothing listens at the URL: connecting would be exit 3)."""
    url = f"nats://127.0.0.1:{free_port()}"
    (tmp_path / "cluster.json").write_text(json.dumps({"client_urls": [url]}))
    p, _ = cli(*argv, "--nats-url", url, "--cluster", str(tmp_path))
    assert (p.returncode, p.stdout) == (2, ""), p
    assert p.stderr == f"error: {' '.join(argv[:2])}: --nats-url and --cluster both say which NATS to reach " \
                       f"(--cluster: the client URLs in its cluster.json); give one of them\n", p.stderr


def test_bench_of_a_version_not_in_the_repository_is_one_line_exit_2(deployment):
    p, _ = cli("bench", "digits", "--nats-url", deployment.nats_url, "--version", "9", "--concurrency", "1",
               "--duration", "1", timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "version '9' is not in the model repository" in lines[0], p.stderr


def test_up_on_an_empty_model_folder_says_so(tmp_path):
    """A folder without any <model>/config.json is served (nothing to refuse), with one note naming it."""
    (tmp_path / "empty").mkdir()
    p = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--nats-port",
                          "0", "--models", str(tmp_path / "empty"), "--run-dir", str(tmp_path / "run")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "COLUMNS": "200"})
    try:
        first = p.stderr.readline()
        assert first.startswith("note: no models in") and str(tmp_path / "empty") in first, first
    finally:
        p.terminate()
        p.wait(30)


def test_up_names_a_triton_model_folder_it_does_not_serve(tmp_path):
    """A Triton repository (``config.pbtxt``, no ``config.json``) started and served no model without a word (a
    fresh-user trial, 2026-12-05): each such folder now gets a note, and so does one with versions and no config."""
    import shutil

    from conftest import MODELS

    repo = tmp_path / "repo"
    for name, cfg in (("triton", "config.pbtxt"), ("bare", None)):
        shutil.copytree(MODELS / "digits" / "1", repo / name / "1")
        if cfg:
            (repo / name / cfg).write_text('name: "triton"\nplatform: "onnxruntime_onnx"\n')
    (repo / "notes").mkdir()  # a folder that looks like no model: no note
    p = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--nats-port",
                          "0", "--models", str(repo), "--run-dir", str(tmp_path / "run")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "COLUMNS": "200"})
    try:
        lines = [p.stderr.readline() for _ in range(3)]
        assert lines[0] == (f"note: {repo / 'bare'} has version folders with a model.onnx and no config.json: not "
                            f"served (docs/models.md: the repository layout)\n"), lines
        assert lines[1].startswith(f"note: {repo / 'triton'} has a config.pbtxt (Triton's text format) and no "
                                   f"config.json: inferbus reads config.json"), lines
        assert lines[2].startswith("note: no models in"), lines
    finally:
        p.terminate()
        p.wait(30)


def _up_refused(tmp_path, *args, argv_head=None, env=None) -> str:
    """``inferbus up ... args`` refused: exit 2, one line on stderr (returned), no traceback, no server started."""
    head = argv_head or [sys.executable, "-m", "inferbus.cli"]
    p = subprocess.run([*head, "up", "--no-cache", "--workers", "1", "--nats-port", "0", "--run-dir",
                        str(tmp_path / "run"), *args], capture_output=True, text=True, timeout=150, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "200", **(env or {})})
    assert p.returncode == 2, (p.stdout[-1500:], p.stderr[-1500:])
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here")
def test_up_with_a_backend_not_installed_is_one_line_exit_2_before_starting_anything(tmp_path):
    """``--backends tensorrt`` (or jax) without its package printed a 100-line traceback ending in
    BackendUnavailable after the servers had started: now found before (importlib.util.find_spec)."""
    line = _up_refused(tmp_path, "--backends", "tensorrt")
    assert line == "error: up: --backends tensorrt: backend tensorrt: not installed (pip install tensorrt; it " \
                   "serves NVIDIA GPUs only)", line
    assert not (tmp_path / "run").exists()
    # jax is installed in the test environment: hidden from the CLI's process (sys.modules["jax"] = None makes
    # both find_spec and import say it is missing)
    hide_jax = [sys.executable, "-c", "import sys; sys.modules['jax'] = None; sys.argv[0] = 'inferbus'; "
                "from inferbus.cli import main; main()"]
    line = _up_refused(tmp_path, "--backends", "onnxruntime,jax", argv_head=hide_jax)
    assert line == "error: up: --backends jax: backend jax: not installed (pip install 'inferbus[jax]')", line
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="an NVIDIA GPU may be here")
def test_up_with_a_backend_without_a_device_is_one_line_exit_2_and_stops_the_servers(tmp_path):
    """A backend whose package is there but that has no device here is known only from the device probe, after
    the embedded servers started: one line, exit 2, and the servers are stopped again. A stand-in ``tensorrt``
    package (importable, no GPU on this machine) makes the probe say so."""
    fake = tmp_path / "site" / "tensorrt"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.0-stand-in'\n")
    site = str(tmp_path / "site")
    line = _up_refused(tmp_path, "--backends", "tensorrt",
                       env={"PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))})
    assert line == "error: up: --backends tensorrt: backend tensorrt: no NVIDIA GPU found", line
    left = processes_naming(str(tmp_path / "run"))
    assert not left, f"processes of the refused node still running: {left}"


@pytest.mark.parametrize("config,said", [
    ({}, None),  # a TypeError traceback (missing 'name'); now the folder's name: served, refused only for --json
    ([], "model 'broken': the config must be a JSON object"),  # an AttributeError traceback
    ({"name": "broken", "max_batch_size": "x"}, "model 'broken': max_batch_size must be an integer"),  # worker died
    ({"name": "broken", "cache_ttl_ms": "abc"}, "model 'broken': cache_ttl_ms must be an integer"),  # INTERNAL
    ({"name": "broken", "default_version": "9"}, "model 'broken': default_version '9' is not a version on disk"),
])
def test_up_with_a_malformed_model_config_is_one_line_naming_it_exit_2(tmp_path, config, said):
    """Each malformed ``config.json`` ended in a traceback, a dead worker, INTERNAL for every request, or was
    accepted silently: now ``up`` refuses it before anything starts, like a corrupt model.onnx, naming the file,
    the model and the field."""
    models = tmp_path / "models"
    shutil.copytree(ROOT / "models" / "digits" / "1", models / "broken" / "1")
    (models / "broken" / "config.json").write_text(json.dumps(config))
    # {} is servable: the same command then stops at the next bad option, checked after the repository was
    # read (--node-id), still before anything starts
    line = _up_refused(tmp_path, "--models", str(models), *(("--node-id", "a b") if said is None else ()))
    if said is None:
        assert "up: --node-id must be 1-64 letters" in line, line
    else:
        assert line.startswith(f"error: up: the model repository cannot be served: {models}/broken/config.json: "), line
        assert said in line, line
    assert not (tmp_path / "run").exists()


def _digits_repo(tmp_path, versions=("1",), data=True) -> Path:
    """A repository with model ``a``: the digits MLP as each of ``versions``, config ``{}``, and the digits
    ``data/test.npz`` when ``data``."""
    models = tmp_path / "models"
    for v in versions:
        (models / "a" / v).mkdir(parents=True)
        shutil.copy(ROOT / "models" / "digits" / "1" / "model.onnx", models / "a" / v / "model.onnx")
    (models / "a" / "config.json").write_text("{}")
    if data:
        (models / "a" / "data").mkdir()
        shutil.copy(ROOT / "models" / "digits" / "data" / "test.npz", models / "a" / "data" / "test.npz")
    return models


def _left_running(run: Path) -> list[str]:
    return processes_naming(str(run))


@pytest.mark.parametrize("case,said", [
    ("junk", "data/test.npz: model 'a': cannot be used as reference rows: not an .npz file"),
    ("pickled", "data/test.npz: model 'a': cannot be used as reference rows: array 'X' holds Python objects "
                "(dtype object), which are pickled and not loaded"),
    ("width", "data/test.npz: model 'a' version 1: cannot be used as reference rows: array 'X' of shape [360, 63] "
              "does not fit input 'pixels' FP32 [-1, 64]: dimension 1 is 63, not 64"),
    ("1+01", "a/01: model 'a': version folder '01' is version 1, as folder '1' is; remove one of them"),
    ("007", "a/007: model 'a': version folder '007' has a leading zero; rename it '7'"),
])
def test_up_with_an_unservable_test_npz_or_version_folder_is_one_line_exit_2(tmp_path, case, said):
    """A user trial: a junk or pickled ``data/test.npz``, or one of the wrong width, crashed ``up`` with a
    185-line traceback (ChildStartError, the worker dead in np.load or ONNX Runtime), exit 1; folders ``1`` and
    ``01`` were served as two versions. Now the repository's check refuses each before anything starts."""
    models = _digits_repo(tmp_path, versions={"1+01": ("1", "01"), "007": ("007",)}.get(case, ("1",)))
    data = models / "a" / "data" / "test.npz"
    if case == "junk":
        data.write_text("junk\n")
    elif case == "pickled":
        np.savez(data, X=np.array([[0.0] * 64, None], dtype=object))
    elif case == "width":
        np.savez(data, X=np.zeros((360, 63), np.float32))
    line = _up_refused(tmp_path, "--models", str(models))
    assert line.startswith("error: up: the model repository cannot be served: "), line
    assert said in line, line
    assert not (tmp_path / "run").exists()  # refused before anything started


@pytest.mark.timeout(120)
def test_up_whose_worker_cannot_load_a_model_is_one_line_naming_it_exit_2(tmp_path):
    """A damage the header check cannot see (a bad CRC in the array's body) fails the worker's load: ``up``
    prints the worker's one line, naming the model and the reason, exit 2, and nothing is left running."""
    models = _digits_repo(tmp_path)
    data = models / "a" / "data" / "test.npz"
    np.savez(data, X=np.load(data)["X"])  # stored (uncompressed): a flipped byte is in the data as is
    raw = bytearray(data.read_bytes())
    raw[raw.find(b"}") + 200] ^= 0xFF
    data.write_bytes(bytes(raw))
    line = _up_refused(tmp_path, "--models", str(models))
    assert line == (f"error: up: the model repository cannot be served: worker:n1-w0: model 'a' version 1 "
                    f"({models}/a/1/model.onnx) could not be loaded: BadZipFile: Bad CRC-32 for file 'X.npy'"), line
    assert not _left_running(tmp_path / "run")


def test_an_actor_that_dies_at_start_for_another_reason_is_one_line_exit_1():
    from inferbus.cli import _child_start_failure
    from inferbus.supervisor import ChildStartError

    exc = ChildStartError("supervisor 'node-n1': child 'ingress:0' failed to start: ingress:0 (pid 7) exited "
                          "(exit code 1) before printing 'READY'; last output:\n  | Traceback ...\n  | "
                          "OSError: boom", child_id="ingress:0", output=("Traceback ...", "OSError: boom", ""))
    assert _child_start_failure(exc) == ("up: supervisor 'node-n1': child 'ingress:0' failed to start: ingress:0 "
                                         "(pid 7) exited (exit code 1) before printing 'READY'; its last output: "
                                         "OSError: boom", 1)


@pytest.mark.timeout(150)
def test_a_good_repository_starts_and_models_load_refuses_what_up_would(tmp_path):
    """Versions 1 and 10 with good reference rows are served (the default is 10, numeric order); at run time
    ``models load`` reads the folder again and refuses a ``02`` folder or a junk test.npz, INVALID_ARGUMENT."""
    models = _digits_repo(tmp_path, versions=("1", "10"))
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--nats-port",
                          "0", "--models", str(models), "--run-dir", str(run)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "400"})
    try:
        out = []
        while not any("model a versions" in x for x in out):
            line = p.stdout.readline()
            assert line, (out, p.stderr.read()[-2000:])
            out.append(line)
        url = re.search(r"NATS (nats://\S+),", "".join(out)).group(1)
        assert "model a versions 1, 10" in out[-1], out
        m, _ = cli("models", "--nats-url", url)
        assert m.returncode == 0 and re.search(r"│ a\s+│ 1,10\s+│ 10\s+│", m.stdout), m.stdout
        (models / "a" / "02").mkdir()
        shutil.copy(models / "a" / "1" / "model.onnx", models / "a" / "02" / "model.onnx")
        r, _ = cli("models", "load", "a", "--nats-url", url)
        assert r.returncode == 2 and r.stderr.startswith("INVALID_ARGUMENT: model 'a' cannot be loaded: ") \
            and "version folder '02' has a leading zero" in r.stderr, r
        shutil.rmtree(models / "a" / "02")
        (models / "a" / "data" / "test.npz").write_text("junk\n")
        r, _ = cli("models", "load", "a", "--nats-url", url)
        assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and "test.npz" in r.stderr, r
    finally:
        p.terminate()
        p.wait(60)
    assert not _left_running(run)


def test_model_commands_with_no_ingress_answering_exit_1_like_health(nats_server):
    """A user trial: with no ingress of that prefix, ``health`` exited 1 but ``models --json`` and ``models load``
    exited 2, the status of bad input. UNAVAILABLE (and DEADLINE_EXCEEDED) is the deployment failing: exit 1."""
    for argv in (("models",), ("models", "--json"), ("models", "load", "digits", "--version", "2", "--json")):
        p, _ = cli(*argv, "--nats-url", nats_server.url, "--prefix", "nobodyhere")
        assert p.returncode == 1 and "Traceback" not in p.stderr + p.stdout, (argv, p)
        assert "UNAVAILABLE" in p.stderr + p.stdout, (argv, p)
    p, _ = cli("models", "load", "dig.its", "--nats-url", nats_server.url, "--prefix", "nobodyhere")
    assert p.returncode == 2, p  # a bad name is still bad input, refused before anything is sent


@pytest.mark.parametrize("args,said", [
    (("--duration", "0"), "bench: --duration must be in (0, 86400] seconds, got 0"),
    (("--duration", "nan"), "bench: --duration must be in (0, 86400] seconds, got nan"),
    (("--timeout-s", "0"), "bench: --timeout-s must be in (0, 3600] seconds, got 0"),
    (("--gens", "0"), "bench: --gens must be in [1, "),
    (("--gens", "100000"), "bench: --gens must be in [1, "),
    (("--rate", "inf"), "bench: each --rate must be in (0, 10,000,000] requests/s, got inf"),
    (("--rate", "1e9"), "bench: each --rate must be in (0, 10,000,000] requests/s, got 1000000000"),
    # a number is echoed as every refusal echoes one (Python's shortest form, no quotes): it said got '2e7'
    (("--rate", "2e7"), "bench: each --rate must be in (0, 10,000,000] requests/s, got 20000000"),
    (("--rate", "100,-1"), "bench: each --rate must be in (0, 10,000,000] requests/s, got -1"),
    (("--rate", "1e300"), "bench: each --rate must be in (0, 10,000,000] requests/s, got 1e+300"),
    (("--rate", "0.5,0"), "bench: each --rate must be in (0, 10,000,000] requests/s, got 0"),
    (("--concurrency", "8,2000000"), "bench: each --concurrency must be in [1, 1,000,000], got 2000000"),
    (("--concurrency", "2e7"), "bench: --concurrency takes integers, comma-separated, got 2e7 in '2e7'"),
    (("--concurrency", "1,x"), "bench: --concurrency takes integers, comma-separated, got 'x' in '1,x'"),
    (("--rate", "100,,200"), "bench: --rate takes numbers of requests/s, comma-separated, got '' in '100,,200'"),
    (("--concurrency", "0"), "bench: each --concurrency must be in [1, 1,000,000], got 0"),
    (("--concurrency", "1,,8"), "bench: --concurrency takes integers, comma-separated, got '' in '1,,8'"),
])
def test_bench_range_errors_name_the_option(args, said):
    """A fresh-user trial (2026-12-02): one line for all four ranges did not say which option was wrong, and
    ``--gens 1000`` on a 2-core box ran the load average to 67. In-process (typer's runner): no CLI start."""
    from typer.testing import CliRunner

    from inferbus.cli import app

    r = CliRunner().invoke(app, ["bench", "digits", "--nats-url", "nats://127.0.0.1:1", *args])
    assert r.exit_code == 2, r.output
    assert said in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("args,said", [
    # what the argument parser refuses (Typer's default was a framed box of several lines; a fresh-user trial)
    (("up", "--workers", "abc"), "error: up: --workers must be an integer, got 'abc' (see "),
    (("models", "unload", "digits"), "error: models unload: Invalid value for VERSION: unload needs a version"),
    (("infer", "digits", "-i", "pixels"), "error: infer: --input takes NAME=FILE.npy, got 'pixels' (see "),
    (("up", "--no-such-option"), "error: up: No such option: --no-such-option"),
    (("no-such-command",), "error: inferbus: No such command 'no-such-command'."),
])
def test_a_usage_error_the_parser_finds_is_one_line_exit_2(args, said):
    p, _ = cli(*args)
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-1000:])
    assert p.stderr.startswith(said) and p.stderr.count("\n") == 1 and "--help)" in p.stderr, p.stderr
    assert not p.stdout


@pytest.mark.parametrize("name,allowed", [("INFERBUS_JAX_TRANSFER", "auto, "), ("INFERBUS_CUDA_SCHEDULE", "")])
def test_a_bad_accelerator_environment_variable_is_refused_in_the_form_of_every_refusal(name, allowed):
    """It said ``environment variable INFERBUS_JAX_TRANSFER='x': one of ...``; now ``... must be one of ..., got
    'x'``, as every refusal of a value; before anything starts."""
    p, _ = cli("up", "--nats-port", "0", env={name: "x"})
    assert p.returncode == 2 and not p.stdout, p
    assert p.stderr.startswith(f"error: up: environment variable {name} must be one of {allowed}"), p.stderr
    assert p.stderr.endswith(" (or unset), got 'x'\n") and p.stderr.count("\n") == 1, p.stderr


def test_help_and_a_bare_group_keep_their_exit_statuses():
    p, _ = cli("--help")
    assert p.returncode == 0 and "Usage: " in p.stdout and " COMMAND " in p.stdout
    p, _ = cli("chaos")  # no command: the group's help, exit 2 as Typer gives it
    assert p.returncode == 2 and "inferbus.cli chaos [OPTIONS] COMMAND" in p.stdout + p.stderr and "error:" not in p.stderr
    p, _ = cli("chaos", "list")
    assert p.returncode == 0 and "worker-crash" in p.stdout


def _help_in_process(*argv: str) -> str:
    """What ``inferbus ARGV`` prints for help (typer's runner: no CLI start per command); exit 0 asserted."""
    from typer.testing import CliRunner

    from inferbus.cli import app

    r = CliRunner().invoke(app, list(argv))
    assert r.exit_code == 0, (argv, r.exit_code, r.output[-1500:])
    return r.output


def test_h_is_help_for_the_root_and_every_group_and_command():
    """``inferbus infer -h`` said ``No such option: -h`` (a fresh-user trial): ``-h`` is ``--help`` everywhere, the
    same help (no command has an option of its own named ``-h``)."""
    paths = [path for path, _ in _commands()]
    assert ("infer",) in paths and ("chaos", "run") in paths and ("models", "load") in paths, paths
    for path in paths:
        assert _help_in_process(*path, "-h") == _help_in_process(*path, "--help"), path
        assert "Usage: " in _help_in_process(*path, "-h"), path
    p, _ = cli("infer", "-h")  # as the user ran it
    assert p.returncode == 0 and "Usage: " in p.stdout and not p.stderr, p


def test_help_shows_no_type_for_a_flag_and_no_braces_around_a_required_argument():
    """typer 0.29's help gave every flag a ``<bool>`` (``--topology --node <bool>``, ``--json <bool>``, ``--help
    <bool>``), as if it took a value, and put a required argument in braces (``chaos run [OPTIONS] {NAME}``); a flag
    now shows no type and a required argument its name alone, an optional one in brackets, rich help or plain."""
    for path, cmd in _commands():
        out = _help_in_process(*path, "--help")
        assert "<bool>" not in out, (path, out)
        assert "<list[" not in out, (path, out)  # a repeatable option says what one value is (infer's -i, -o)
        usage = next(line for line in out.splitlines() if "Usage: " in line)
        assert "{" not in usage and "}" not in usage, (path, usage)
        flags = [o for prm in cmd.params if getattr(prm, "is_flag", False) and not prm.hidden for o in prm.opts
                 if o.startswith("--")]
        for flag in flags:  # its row: the flag's names, then straight to the help text (no type between)
            row = next(line for line in out.splitlines() if re.search(rf"^│ [ *]*{flag}(?![\w-])", line))
            assert not re.search(r"<\w+>", row.split(flag, 1)[1][:40]), (path, flag, row)
    for argv, said in ((("chaos", "run"), "chaos run [OPTIONS] NAME"), (("infer",), "infer [OPTIONS] MODEL"),
                       (("models", "load"), "models load [OPTIONS] NAME [VERSION]")):
        usage = next(line for line in _help_in_process(*argv, "--help").splitlines() if "Usage: " in line)
        assert usage.rstrip().endswith(said), usage
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "TYPER_USE_RICH")}
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "chaos", "run", "--help"], capture_output=True, text=True,
                       timeout=30, cwd=ROOT, env={**env, "COLUMNS": "120", "TYPER_USE_RICH": "0"})  # click's plain help
    assert p.returncode == 0 and "chaos run [OPTIONS] NAME\n" in p.stdout and "<bool>" not in p.stdout, p.stdout
    # the drill name is still checked (tests/test_cli_usage_errors.py: unknown-drill)
    p, _ = cli("chaos", "run", "no-such-drill")
    assert p.returncode == 2 and p.stderr.startswith("error: chaos run: unknown drill 'no-such-drill'; known drills: "), p.stderr


def test_help_separates_option_names_with_a_comma_and_a_space_and_writes_every_type_one_way():
    """A fresh-user trial: the help joined an option's names with a comma alone (``--help,-h``, ``--input,-i``,
    ``--timeout-s,--timeout``), and wrote the value an option takes two ways: ``<str>``, ``<int>``, ``<path>`` mostly,
    but ``PATH`` (bench ``--models``), ``NAME`` (up ``--model``, infer ``-o``), ``ID`` (health ``--ingress``) and
    ``NAME=FILE.npy`` (infer ``-i``). Now ``--help, -h`` everywhere, and every option's value as the most of them
    were: ``<path>``, ``<name>``, ``<id>``, ``<name>=<file.npy>`` (an argument keeps its name, ``MODEL``, in
    capitals: that is the usage line's word for it, and its type follows, ``MODEL <str>``)."""
    import typer

    helps = _every_help_at(200)
    for path, cmd in _commands():
        name = " ".join(path) or "(root)"
        out = helps[path]
        rows = [line for line in out.splitlines() if re.match(r"│ [ *]*-", line)]
        assert any(line.startswith(("│ --help, -h ", "│   --help, -h ")) for line in rows), (name, out)
        # (the names alone: a help text in the same row may hold "1,000,000")
        assert not [line for line in rows if re.search(r",\S", re.match(r"│ [ *]*((?:-[\w-]+,? ?)+)", line).group(1))], \
            (name, rows)
        ctx = typer.Context(cmd, info_name=path[-1] if path else "inferbus")
        for prm in cmd.params:
            if prm.param_type_name != "option" or prm.hidden or prm.is_flag or prm.count:
                continue
            shown = prm.display_type_rich(ctx)
            assert re.fullmatch(r"<[a-z][a-z0-9_.-]*>(=<[a-z][a-z0-9_.-]*>)?(\.\.\.)?", shown), (name, prm.opts, shown)
            row = next(line for line in rows if re.match(rf"│ [ *]*(?:[\w-]+, )*{re.escape(prm.opts[0])}(?![\w-])", line))
            assert f" {shown} " in row, (name, prm.opts, shown, row)
    for argv, said in ((("infer",), "--input, -i <name>=<file.npy>"), (("infer",), "--output, -o <name>"),
                       (("bench",), "--models <path>"), (("health",), "--ingress <id>"), (("up",), "--model <name>"),
                       (("models", "load"), "--timeout-s, --timeout <float>")):
        assert said in " ".join(helps[argv].split()), (argv, said)


def test_a_flag_pairs_default_reads_on_or_off():
    """A fresh-user trial: a ``--x/--no-x`` pair's default was the name of the flag in effect without its dashes,
    ``[default: no-colocate]``, ``[default: proxy]``, read as a value to give. The rule now, for every such pair
    of every command, rich help or plain: ``[default: on]`` where the default is on, ``[default: off]`` where it is
    off (shown both ways: a pair whose default depends on another option, ``--run-to-completion``, shows none, so
    an absent default is not read as off); a lone flag (``--json``) shows none when off, as before."""
    import subprocess as sp

    helps = _every_help_at(200)
    pairs = 0
    for path, cmd in _commands():
        name = " ".join(path) or "(root)"
        lines = helps[path].splitlines()
        assert "[default: no-" not in helps[path], (name, helps[path])
        for prm in cmd.params:
            if not (getattr(prm, "is_bool_flag", False) and prm.secondary_opts and not prm.hidden):
                continue
            if not all(o.startswith("--no-") for o in prm.secondary_opts):
                continue
            at = next(i for i, line in enumerate(lines) if re.match(rf"│ [ *]*{re.escape(prm.opts[0])}(?![\w-])", line))
            end = next((i for i in range(at + 1, len(lines)) if re.match(r"│ [ *]*--(?!no-)", lines[i])
                        or not lines[i].startswith("│")), len(lines))
            said = re.findall(r"\[default: ([^]]*)\]", " ".join(lines[at:end]))
            expected = [] if prm.default is None else ["on" if prm.default else "off"]
            assert said == expected, (name, prm.opts, said, lines[at:end])
            pairs += 1
    assert pairs >= 15, pairs  # (up's --colocate ... --fault-injection, bench's, cluster's, region's)
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "TYPER_USE_RICH")}
    plain = sp.run([sys.executable, "-m", "inferbus.cli", "up", "--help"], capture_output=True, text=True, timeout=30,
                   cwd=ROOT, env={**env, "COLUMNS": "200", "TYPER_USE_RICH": "0"}).stdout
    block = plain.split("--colocate / --no-colocate", 1)[1].split("\n  -", 1)[0]  # (click wraps at 80)
    assert " ".join(block.split()).endswith("[default: off]") and "[default: no-" not in plain, block
    assert "--json" in helps[("models",)] and "[default: off]" not in " ".join(
        line for line in helps[("models",)].splitlines() if "--json" in line), helps[("models",)]


def test_the_models_table_shows_max_batch_size_cache_ttl_and_description(deployment):
    """A fresh-user trial: ``inferbus models`` did not show a model's ``max_batch_size``, ``cache_ttl_ms`` or
    ``description`` (config.json), nor did its metadata."""
    p, _ = cli("models", "--nats-url", deployment.nats_url, env={"COLUMNS": "400"})
    assert p.returncode == 0, p.stderr
    assert "max batch" in p.stdout and "cache ttl ms" in p.stdout and "description" in p.stdout, p.stdout
    row = next(line for line in p.stdout.splitlines() if " digits " in line)
    cells = [c.strip() for c in row.split("│")]
    assert "64" in cells and "100" in cells and any(c.startswith("Handwritten digit") for c in cells), cells


def test_models_and_nodes_on_a_narrow_terminal_print_name_value_blocks_not_cut_cells(deployment, tmp_path):
    """A fresh-user trial: on an 80-column terminal rich fitted the ``models`` and ``nodes`` tables by cutting every
    cell (``versi…``, ``onnxr…``, ``node-n1-ser…``), worse at 60; piped they ignored ``COLUMNS`` (a table of 160
    columns with ``COLUMNS=80``). Where the table does not fit without cutting, each model (each supervisor and
    child) is a block of ``name=value`` items wrapped between items, as ``bench``'s results; piped, the width is
    ``COLUMNS`` where it is set, as for ``--help``."""
    listed = json.loads(cli("models", "--nats-url", deployment.nats_url, "--json")[0].stdout)["models"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    piped = {}
    for command in ("models", "nodes"):
        p, _ = cli(command, "--nats-url", deployment.nats_url, env={"COLUMNS": "60"})
        assert p.returncode == 0, p.stderr
        piped[command] = p.stdout
    for said, (models, nodes) in {
            "piped, COLUMNS=60": (piped["models"], piped["nodes"]),
            "a pty of 80 columns": (run_in_a_pty([sys.executable, "-m", "inferbus.cli", command, "--nats-url",
                                                  deployment.nats_url], 80, env, tmp_path / f"{command}.stderr")
                                     for command in ("models", "nodes"))
    }.items():
        width = 60 if said.startswith("piped") else 80
        for out in (models, nodes):
            assert "…" not in out and "┃" not in out, (said, out)
            assert max(len(line) for line in out.splitlines()) <= width, (said, out)
        assert models.splitlines()[0] == "models", (said, models)
        blocks = "\n".join(models.splitlines()[1:]).replace("\n    ", " ").splitlines()  # one line per model
        assert [b.split(":")[0] for b in blocks] == [m["name"] for m in listed], (said, models)
        for m, block in zip(listed, blocks):
            assert f"versions={','.join(m['versions'])} " in block and f" platform={m['platform']} " in block, block
            assert f" max_batch={m['parameters']['max_batch_size']} " in block, block
            assert " description=" + " ".join(m["parameters"]["description"].split()) in block, block
        assert nodes.startswith(f"node n1 (pid {deployment.proc.pid}, up "), (said, nodes)
        children = [m.group(1) for line in nodes.splitlines() if (m := re.match(r"  child (\S+): actors=", line))]
        assert {"nats", "valkey", "aggregator", "worker:n1-w0", "worker:n1-w1", "ingress:0"} <= set(children), nodes
        assert "supervisor node-n1: state=running strategy=one_for_one" in nodes, (said, nodes)
    # where it fits, still the table: one line per model at 1000 columns, its title with no padding after it
    p, _ = cli("models", "--nats-url", deployment.nats_url, env={"COLUMNS": "1000"})
    assert p.stdout.splitlines()[0].strip() == "models" and not p.stdout.splitlines()[0].endswith(" "), p.stdout
    assert sum(line.startswith("│ ") for line in p.stdout.splitlines()) == len(listed), p.stdout


def test_devices_ends_no_line_in_blanks_piped_or_on_a_terminal(tmp_path):
    """A fresh-user trial: ``devices``' footer (``jax: ...; tensorrt: ...; onnxruntime providers: ...``), wrapped by
    rich, ended its lines with the space it broke at (``tensorrt: not installed (pip install ``). No line of any
    command's output ends in blanks: the commands' consoles take them out (``BlankFreeConsole``); here ``devices``
    piped at 40, 60 and 80 columns (the footer wraps at one of them at least, whatever is installed) and on a
    terminal (a pty) of 60."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    outs = {}
    for columns in (40, 60, 80):
        p, _ = cli("devices", env={"COLUMNS": str(columns)})
        assert p.returncode == 0, p.stderr
        outs[f"piped, COLUMNS={columns}"] = p.stdout
    outs["a pty of 60 columns"] = run_in_a_pty([sys.executable, "-m", "inferbus.cli", "devices"], 60, env,
                                               tmp_path / "stderr")
    assert any(len(line) > 40 for line in outs["piped, COLUMNS=80"].splitlines() if "providers" in line), outs
    for said, out in outs.items():
        assert "providers:" in out, (said, out)
        assert not [line for line in out.splitlines() if line != line.rstrip()], (said, out)


def test_the_commands_consoles_end_no_line_in_blanks_and_keep_their_colours():
    """:class:`~inferbus.cli.BlankFreeConsole` (every command's ``console`` and ``err_console``, typer's help):
    the blanks before each line break go, the colour codes among them stay (a line that ends in a coloured word
    ends in its reset code), and a blank not at a line's end stays."""
    from rich.console import Console

    from inferbus.cli import BlankFreeConsole

    def shown(cls, **kw) -> str:
        con = cls(file=io.StringIO(), width=24, force_terminal=True, color_system="standard", **kw)
        con.print("plain words [bold]bold words[/] " * 4 + "[on red]   [/]")
        con.print("last ", end="")
        return con.file.getvalue()

    before, after = shown(Console), shown(BlankFreeConsole)
    plain = re.compile(r"\x1b\[[0-9;]*m")
    assert any(line != line.rstrip() for line in plain.sub("", before).splitlines()), before  # (rich's own: blanks)
    assert not [line for line in plain.sub("", after).splitlines()[:-1] if line != line.rstrip()], after
    assert plain.findall(after) == plain.findall(before), (before, after)  # every colour code kept
    assert [line.rstrip() for line in plain.sub("", before).splitlines()] == plain.sub("", after).splitlines()[:-1] + [
        "last"], after
    assert after.endswith("last "), after  # (no line break after it: not a line's end)


def test_piped_output_takes_columns_where_set_as_help_does(monkeypatch):
    """Piped, the commands' output was laid out in 160 columns whatever ``COLUMNS`` said, where ``--help`` follows it
    (``COLUMNS=80 inferbus models | less``: a 160-column table). ``COLUMNS`` where it is set, else 160 (a log keeps
    its lines whole; ``up``'s first line, grepped for, stays one line there); on a terminal, rich's choice."""
    import io

    from inferbus import cli as cli_module

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    for columns, width in (("60", 60), ("80", 80), ("", 160), ("0", 160), ("x", 160)):
        monkeypatch.setenv("COLUMNS", columns)
        assert cli_module._output_width() == width, columns
    monkeypatch.delenv("COLUMNS")
    assert cli_module._output_width() == 160


def test_chaos_list_wraps_each_summary_to_columns_under_the_summaries():
    """``chaos list`` printed each drill on one line whatever the width (up to ~130 characters at ``COLUMNS=60``):
    each summary now wraps to the width, its further lines under the summaries' column."""
    from chaos.drills import DRILLS

    p, _ = cli("chaos", "list", env={"COLUMNS": "60"})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(len(line) for line in lines) <= 60 and len(lines) > len(DRILLS), p.stdout
    entries = "\n".join(lines).replace("\n" + " " * 19, " ").splitlines()
    assert [e.split()[0] for e in entries] == sorted(DRILLS), p.stdout
    for entry in entries:
        name = entry.split()[0]
        assert entry == f"{name:18s} {' '.join(DRILLS[name].summary.split())}", entry


@pytest.mark.parametrize("region", ["", " ", "a.b", "x" * 65])
def test_up_refuses_a_region_that_is_no_name(tmp_path, region):
    """``--region ''`` started a node with no region where ``' '`` and ``a.b`` were refused (a fresh-user trial)."""
    line = _up_refused(tmp_path, "--region", region)
    assert line == f"error: up: --region must be 1-64 letters, digits, '-' or '_', got {region!r}", line


def test_up_notes_a_config_json_whose_inputs_contradict_model_onnx(tmp_path):
    """A fresh-user trial set ``"dims": [31]`` on fraud's input in config.json (model.onnx takes 30): ``up`` started
    without a word, ``inferbus models`` showed 30, and a client that followed config.json was refused. Those keys are
    not read; ``up`` now says where they contradict model.onnx (here before a bad option stops the start)."""
    from conftest import MODELS

    repo = tmp_path / "models"
    shutil.copytree(MODELS / "fraud", repo / "fraud")
    cfg = json.loads((repo / "fraud" / "config.json").read_text())
    cfg["input"][0]["dims"] = [31]
    cfg["output"].append({"name": "nope", "data_type": "TYPE_FP32", "dims": [1]})
    cfg["input"][0]["data_type"] = "TYPE_FP64"  # a Triton user's likeliest slip (a later trial: no note for it)
    (repo / "fraud" / "config.json").write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--models",
                        str(repo), "--mailbox-size", "0", "--run-dir", str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=30, cwd=ROOT, env={**os.environ, "COLUMNS": "300"})
    assert p.returncode == 2 and "up: --mailbox-size must be in [1, " in p.stderr, p.stderr
    name = cfg["input"][0]["name"]
    assert (f"note: model fraud: config.json gives input {name!r} dims [31], model.onnx (version 1) [30] after the "
            f"batch dimension: requests must fit model.onnx (docs/models.md: keys not read)") in p.stderr, p.stderr
    assert "config.json names output 'nope', which model.onnx (version 1) does not have" in p.stderr, p.stderr
    assert (f"note: model fraud: config.json gives input {name!r} data_type TYPE_FP64, model.onnx (version 1) FP32: "
            f"requests must fit model.onnx") in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--models",
                        str(MODELS), "--mailbox-size", "0", "--run-dir", str(tmp_path / "run2")], capture_output=True,
                       text=True, timeout=30, cwd=ROOT, env={**os.environ, "COLUMNS": "300"})
    assert p.returncode == 2 and "note:" not in p.stderr, p.stderr  # the shipped models agree with their configs


def test_up_on_a_bf16_model_says_the_onnxruntime_backend_cannot_run_it_and_what_to_do(tmp_path):
    """A fresh-user trial: ``up`` on a model with BF16 tensors stopped with ONNX Runtime's line alone (``Numpy_type 256
    can't be converted to MLDataType``), which names no cause. The line now says BF16 is the cause and the ways out."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "bf16_identity",
                          [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [None, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [None, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (tmp_path / "models" / "bf" / "1").mkdir(parents=True)
    (tmp_path / "models" / "bf" / "config.json").write_text("{}")
    (tmp_path / "models" / "bf" / "1" / "model.onnx").write_bytes(m.SerializeToString())
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", "up", "--no-cache", "--workers", "1", "--nats-port",
                        "0", "--models", str(tmp_path / "models"), "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "COLUMNS": "400"})
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert ("(BF16 tensors ['x', 'y']: the onnxruntime backend cannot run them; serve the model with --backend jax, or "
            "export it with FP32 or FP16 inputs and outputs: docs/accelerators.md, limits)") in p.stderr, p.stderr


@pytest.mark.parametrize("version, said", [("01", "has a leading zero: write it '1'"), ("v1", "is not a number"),
                                           ("", "is not a number")])
def test_bench_refuses_a_version_no_folder_can_be_named_before_connecting(version, said):
    """A fresh-user trial: ``bench --version 01`` (or ``v1``) said NOT_FOUND "not in the model repository" where the
    SDK and the ingress say INVALID_ARGUMENT "write it '1'", and ``--version ''`` ran the default version without a
    word. One line, exit 2, before any connection (the NATS URL here reaches nothing)."""
    p, _ = cli("bench", "digits", "--version", version, "--nats-url", f"nats://127.0.0.1:{free_port()}",
               "--concurrency", "1", "--duration", "0.1")
    assert p.returncode == 2, p
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and f"bench: --version {version!r}: " in p.stderr, p
    assert said in p.stderr, p.stderr


def test_every_option_says_what_it_is():
    """A fresh-user trial: ``infer --prefix``, ``health --nats-url``, ``up --nats-user`` and ``region manager``'s
    ``--prefix``, ``--heartbeat-ms``, ``--lease-ms`` and ``--suspect-ms`` showed a default and nothing else."""
    bare = [f"{' '.join(path)} {prm.opts[0]}" for path, cmd in _commands() for prm in cmd.params
            if prm.param_type_name == "option" and not prm.hidden and not (prm.help or "").strip()]
    assert not bare, bare
