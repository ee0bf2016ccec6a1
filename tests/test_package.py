"""The package's top level: lazy exports of the SDK and the typed errors."""

import subprocess
import sys


def test_client_and_errors_exported_lazily():
    # a fresh interpreter: this test process has imported everything already
    code = """
import sys

import inferbus.schemas
assert "inferbus.client" not in sys.modules and "nats" not in sys.modules, "schemas import pulled in the client"
import inferbus
from inferbus.client import Client, InferResult
from inferbus.schemas import InferbusError, Unavailable, InvalidArgument
assert inferbus.Client is Client and inferbus.InferResult is InferResult
assert inferbus.Unavailable is Unavailable and inferbus.InvalidArgument is InvalidArgument
assert issubclass(inferbus.Unavailable, inferbus.InferbusError)
assert "Client" in dir(inferbus) and "Client" in inferbus.__all__
assert not {"Any", "importlib", "annotations"} & set(dir(inferbus)), dir(inferbus)  # no helper imports shown
try:
    inferbus.NoSuchThing
except AttributeError as exc:
    assert "NoSuchThing" in str(exc)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
