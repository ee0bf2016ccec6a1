"""The `inferbus` command as a user runs it: one-line typed errors (no tracebacks), outputs printed intact."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from inferbus.bus import free_port

pytestmark = pytest.mark.timeout(60)


def cli(*args, timeout=30):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "inferbus.cli", *args], capture_output=True, text=True,
                       timeout=timeout, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    return p, time.monotonic() - t0


def test_unreachable_nats_is_one_line_not_a_traceback():
    for cmd in ("models", "health"):
        p, dt = cli(cmd, "--nats-url", f"nats://127.0.0.1:{free_port()}")
        assert p.returncode == 2, p
        assert "Traceback" not in p.stderr + p.stdout
        assert "cannot reach NATS" in p.stderr
        assert dt < 15


def test_bad_input_files(tmp_path):
    p, _ = cli("infer", "digits", "-i", f"pixels={tmp_path / 'missing.npy'}")
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr
    junk = tmp_path / "junk.npy"
    junk.write_text("not numpy")
    p, _ = cli("infer", "digits", "-i", f"pixels={junk}")
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr


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
