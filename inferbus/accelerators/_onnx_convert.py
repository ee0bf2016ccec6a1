"""ONNX graph rewrites for reduced precision, shared by the ONNX Runtime and TensorRT backends.

* :func:`gemm_to_matmul`: ``Gemm`` → ``MatMul`` + ``Add`` (ORT's quantizers handle MatMul, not Gemm).
* :func:`to_fp16`: an fp32 graph as an fp16 graph with fp32 inputs and outputs
  (what TensorRT 11 needs: it removed ``BuilderFlag.FP16`` and builds only
  strongly typed networks, so the precision must be in the graph).
* :func:`quantize_qdq`: int8 explicit quantization (QuantizeLinear /
  DequantizeLinear pairs, symmetric, per-channel weights) calibrated on the
  model's own reference rows with ONNX Runtime's static quantizer: what
  TensorRT ≥ 10.1 asks for instead of its deprecated (10.x) and removed (11.x)
  INT8 calibrators.

All need the ``onnx`` package. These functions return new models and never
modify their argument.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ._abc import PrecisionRefused

_FLOAT, _FLOAT16 = 1, 10

# ops whose fp16 form is risky (range or accumulation): computed in fp32 between Casts
_KEEP_FP32 = {"Softmax", "LogSoftmax", "ReduceSum", "ReduceMean", "Exp", "Log", "Sigmoid", "LayerNormalization"}


def gemm_to_matmul(model):
    """Rewrite every plain ``Gemm`` (alpha = beta = 1, transA = 0, 2-D weight initializer) as ``MatMul`` + ``Add``.

    Returns a new ``onnx.ModelProto``; the input is not modified. ``Gemm`` nodes of any other form are kept.
    """
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        at = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        plain = (n.op_type == "Gemm" and at.get("alpha", 1.0) == 1.0 and at.get("beta", 1.0) == 1.0
                 and not at.get("transA", 0) and n.input[1] in inits)
        if not plain:
            nodes.append(n)
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        if at.get("transB", 0):
            w = w.T.copy()
        wname = n.input[1] + ".matmul"
        m.graph.initializer.append(numpy_helper.from_array(w, wname))
        mm_out = n.output[0] + ".mm" if len(n.input) > 2 and n.input[2] else n.output[0]
        nodes.append(helper.make_node("MatMul", [n.input[0], wname], [mm_out], name=(n.name or "gemm") + "_matmul"))
        if mm_out != n.output[0]:
            nodes.append(helper.make_node("Add", [mm_out, n.input[2]], [n.output[0]], name=(n.name or "gemm") + "_bias"))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    used = {i for n in m.graph.node for i in n.input}
    keep = [i for i in m.graph.initializer if i.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    return m



def to_fp16(model, keep_fp32_ops: set[str] | None = None):
    """The fp32 model as fp16 inside, fp32 at its inputs and outputs.

    Float initializers become fp16; each fp32 graph input gets a ``Cast`` to fp16
    after it and each fp32 output a ``Cast`` back; ``Cast(to=FLOAT)`` nodes cast to
    FLOAT16; ops in ``keep_fp32_ops`` (default: softmax, reductions, exp/log,
    sigmoid, layer norm) run in fp32 between Casts.

    Raises:
        PrecisionRefused: the graph has value_info or attributes this rewrite does not understand.
    """
    import onnx
    from onnx import helper, numpy_helper

    keep = _KEEP_FP32 if keep_fp32_ops is None else keep_fp32_ops
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    new_inits = []
    for init in g.initializer:
        if init.data_type == _FLOAT:
            new_inits.append(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
        else:
            new_inits.append(init)
    del g.initializer[:]
    g.initializer.extend(new_inits)
    init_names = {i.name for i in g.initializer}
    rename: dict[str, str] = {}
    head = []
    for inp in g.input:
        if inp.name in init_names or inp.type.tensor_type.elem_type != _FLOAT:
            continue
        h = inp.name + ".fp16"
        head.append(helper.make_node("Cast", [inp.name], [h], to=_FLOAT16, name=inp.name + "_to_fp16"))
        rename[inp.name] = h
    out_names = {o.name for o in g.output if o.type.tensor_type.elem_type == _FLOAT}
    body = []
    for n in g.node:
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        for i, x in enumerate(n2.input):
            if x in rename:
                n2.input[i] = rename[x]
        if n2.op_type == "Cast":
            for a in n2.attribute:
                if a.name == "to" and a.i == _FLOAT:
                    a.i = _FLOAT16
        if n2.op_type == "Constant":
            for a in n2.attribute:
                if a.name == "value" and a.t.data_type == _FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
        if n2.op_type in keep:
            ins = []
            for i, x in enumerate(n2.input):
                if not x or i > 0 and n2.op_type.startswith("Reduce"):
                    ins.append(x)
                    continue
                c = f"{x}.to32.{n2.name or n2.op_type}"
                body.append(helper.make_node("Cast", [x], [c], to=_FLOAT, name=c))
                ins.append(c)
            del n2.input[:]
            n2.input.extend(ins)
            outs = list(n2.output)
            del n2.output[:]
            n2.output.extend([o + ".fp32" for o in outs])
            body.append(n2)
            for o in outs:
                body.append(helper.make_node("Cast", [o + ".fp32"], [o], to=_FLOAT16, name=o + "_to_fp16"))
            continue
        body.append(n2)
    # outputs: produce fp16 under a new name, then Cast to the declared fp32 name
    tail = []
    for o in out_names:
        h = o + ".fp16out"
        for n2 in body:
            for i, x in enumerate(n2.output):
                if x == o:
                    n2.output[i] = h
            for i, x in enumerate(n2.input):
                if x == o:
                    n2.input[i] = h
        tail.append(helper.make_node("Cast", [h], [o], to=_FLOAT, name=o + "_to_fp32"))
    del g.node[:]
    g.node.extend(head + body + tail)
    del g.value_info[:]  # shapes/types inside changed; let consumers infer them again
    return m


def quantize_qdq(model_path: Path, calibration: dict[str, np.ndarray], per_channel: bool = True) -> bytes:
    """int8 Q/DQ model calibrated on ``calibration`` (inputs by name, rows along axis 0), serialized.

    Symmetric activations and weights (TensorRT requires symmetric int8 Q/DQ), MinMax calibration,
    ``Gemm`` rewritten as ``MatMul`` + ``Add`` first.

    Raises:
        PrecisionRefused: onnx missing or quantization failed.
    """
    try:
        import onnx
        from onnxruntime.quantization import (
            CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static,
        )
    except ImportError as exc:
        raise PrecisionRefused("int8 Q/DQ quantization needs the onnx package") from exc

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            n = len(next(iter(calibration.values())))
            self._rows = iter([{k: v[i:i + 1] for k, v in calibration.items()} for i in range(n)])

        def get_next(self):
            return next(self._rows, None)

    try:
        model = gemm_to_matmul(onnx.load(str(model_path)))
        with tempfile.TemporaryDirectory(prefix="inferbus-qdq-") as tmp:
            src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
            onnx.save(model, str(src))
            quantize_static(src, dst, _Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=["MatMul", "Conv"],
                            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
            return dst.read_bytes()
    except Exception as exc:
        raise PrecisionRefused(f"int8 Q/DQ quantization failed: {exc}") from exc
