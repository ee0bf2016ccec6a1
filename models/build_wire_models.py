#!/usr/bin/env python
"""Build the BYTES wire-format test model ``models/strings`` (deterministic, no training, no data).

``strings/1/model.onnx``: one BYTES (ONNX ``string``) input ``s`` of shape
[-1, 1] and two outputs:

* ``echo``    = Identity(s): the input back, element for element;
* ``doubled`` = StringConcat(s, s): each element twice (an answer twice the size
  of the request, for the "response over max_payload" test).

Opset 20 (StringConcat), IR version 9; runs on the onnxruntime CPU provider
(>= 1.18). ONNX Runtime's Python API passes string tensors as text, so inferbus
workers hand BYTES elements to it as UTF-8 text; bytes that are not valid UTF-8
are refused with INVALID_ARGUMENT naming the field (docs/failure-semantics.md).

Run ``python models/build_wire_models.py``; the output is byte-identical for the
same onnx version (the graph has no weights, no timestamps).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent


def build_strings() -> onnx.ModelProto:
    s = helper.make_tensor_value_info("s", TensorProto.STRING, ["batch", 1])
    echo = helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch", 1])
    doubled = helper.make_tensor_value_info("doubled", TensorProto.STRING, ["batch", 1])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["echo"], name="echo"),
         helper.make_node("StringConcat", ["s", "s"], ["doubled"], name="doubled")],
        "strings", [s], [echo, doubled])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9,
                              producer_name="inferbus-models", producer_version="1")
    onnx.checker.check_model(model)
    return model


CONFIG = {
    "name": "strings",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 64,
    "cache_ttl_ms": 100,
    "default_version": 1,
    "description": "Untrained BYTES wire-format model: echo = Identity(s), doubled = StringConcat(s, s) for a "
                   "BYTES input s [-1, 1] (UTF-8 text for the onnxruntime runtime).",
    "input": [{"name": "s", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "echo", "data_type": "TYPE_STRING", "dims": [1]},
               {"name": "doubled", "data_type": "TYPE_STRING", "dims": [1]}],
}


def main() -> None:
    folder = ROOT / "strings"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.onnx").write_bytes(build_strings().SerializeToString())
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return
    sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.array([["héllo"], [""]], dtype=object)
    echo, doubled = sess.run(None, {"s": x})
    assert echo.tolist() == [["héllo"], [""]] and doubled.tolist() == [["héllohéllo"], [""]]
    print(f"strings/1/model.onnx: {(folder / '1' / 'model.onnx').stat().st_size} bytes, checked with onnxruntime")


if __name__ == "__main__":
    main()
