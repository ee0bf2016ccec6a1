"""A small ONNX → JAX interpreter: one ONNX graph becomes one pure, jittable JAX function.

Why our own: DESIGN §5 asks for a converter verified against current JAX. The
published one, ``jaxonnxruntime`` 0.3.0 (its last release, August 2023), does
run our MLPs under JAX 0.10 but imports ``absl`` without declaring it, pins
``onnx==1.12`` in its ``all`` extra, and has no notion of a compute precision
(it runs every op in the graph's dtypes). This module covers the ops the
shipped models use (table in docs/accelerators.md) in ~300 lines, with the
precision policy below; ``tests/test_accelerators.py`` checks every op against
ONNX Runtime, and against ``jaxonnxruntime`` where that imports.

Precision policy (``compute_dtype`` = float32, float16 or bfloat16):

* Every FLOAT (fp32) tensor of the graph is held in ``compute_dtype``: float
  initializers are cast once at load, float graph inputs on entry, and
  ``Cast(to=FLOAT)`` casts to ``compute_dtype``. Integer, bool, fp16 and fp64
  tensors keep their ONNX dtype.
* Matrix products and convolutions accumulate in fp32
  (``preferred_element_type``); at fp32 they run at ``Precision.HIGHEST`` so a
  GPU or TPU computes true fp32 (no TF32 / bf16 passes).
* Exponentials and reductions (Softmax, LogSoftmax, Sigmoid, Tanh, Exp, Log,
  Erf, ReduceSum, ReduceMean) run in fp32 and cast back, the usual
  mixed-precision "fp32 list" (as in PyTorch AMP).
* Graph outputs are cast back to their declared dtypes.

Shapes: the graph must be static apart from its dynamic batch dimension.
Shape-like operands (Reshape's shape, axes of ReduceSum/Unsqueeze/Squeeze) must
be initializers or ``Constant`` nodes; they are read at trace time. Float
initializers become *parameters* (passed to the jitted function, so they stay
on the device as arrays instead of being folded into the program); every other
initializer is a trace-time constant.

Raises :class:`UnsupportedGraph` (a ``ValueError``) for an op or attribute form
it does not implement, naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


class UnsupportedGraph(ValueError):
    """The graph uses an op or form this interpreter does not implement."""


# ONNX TensorProto.DataType → numpy dtype (https://onnx.ai/onnx/api/mapping.html)
_ONNX_DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
    10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
}
_FLOAT = 1
_BF16 = 16

OPS_SUPPORTED = (
    "Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
    "Neg", "Abs", "Erf", "Softmax", "LogSoftmax", "Cast", "ReduceSum", "ReduceMean", "Identity", "Flatten",
    "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Concat", "Conv", "MaxPool", "AveragePool",
    "GlobalAveragePool", "Clip", "Constant", "Dropout",
)
"""ONNX ops (default domain, opset 13-17 forms) this interpreter implements."""


@dataclass(frozen=True)
class _Node:
    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class OnnxJaxProgram:
    """An ONNX model as ``fn(params, inputs) -> outputs`` for JAX.

    Args:
        model: an ``onnx.ModelProto`` (default domain only, opset ≤ 17 semantics).
        compute_dtype: numpy dtype that fp32 tensors are held in (float32, float16
            or ``ml_dtypes.bfloat16``); see the module docstring.

    Attributes:
        params: float initializers, cast to ``compute_dtype`` (numpy; put them on
            a device once and pass them to every call).
        input_names / output_names: graph inputs (without initializers) and outputs.
        output_dtypes: declared numpy dtype of each output.

    Raises:
        UnsupportedGraph: an op, attribute or non-static shape operand is not supported.
    """

    def __init__(self, model, compute_dtype=np.float32) -> None:
        from onnx import numpy_helper

        self.compute_dtype = np.dtype(compute_dtype)
        g = model.graph
        for imp in model.opset_import:
            if imp.domain not in ("", "ai.onnx"):
                raise UnsupportedGraph(f"opset domain {imp.domain!r} is not supported (default domain only)")
        self.consts: dict[str, np.ndarray] = {}
        self.params: dict[str, np.ndarray] = {}
        for init in g.initializer:
            arr = numpy_helper.to_array(init)
            if arr.dtype == np.float32:
                self.params[init.name] = arr.astype(self.compute_dtype)
            else:
                self.consts[init.name] = arr
        init_names = {i.name for i in g.initializer}
        self.input_names = tuple(i.name for i in g.input if i.name not in init_names)
        self.input_dtypes = {i.name: _ONNX_DTYPES.get(i.type.tensor_type.elem_type) for i in g.input}
        self.output_names = tuple(o.name for o in g.output)
        self.output_dtypes = {o.name: np.dtype(_ONNX_DTYPES.get(o.type.tensor_type.elem_type, np.float32))
                              for o in g.output}
        self.nodes: list[_Node] = []
        for n in g.node:
            if n.domain not in ("", "ai.onnx"):
                raise UnsupportedGraph(f"node {n.name!r}: domain {n.domain!r} is not supported")
            if n.op_type not in OPS_SUPPORTED:
                raise UnsupportedGraph(f"node {n.name!r}: op {n.op_type} is not supported by the JAX interpreter "
                                       f"(supported: {', '.join(OPS_SUPPORTED)})")
            attrs = _attrs(n)
            if n.op_type == "Constant":
                if "value" not in attrs:
                    raise UnsupportedGraph(f"node {n.name!r}: Constant supports the 'value' attribute only")
                arr = numpy_helper.to_array(attrs["value"])
                if arr.dtype == np.float32:
                    self.params[n.output[0]] = arr.astype(self.compute_dtype)
                else:
                    self.consts[n.output[0]] = arr
                continue
            self.nodes.append(_Node(n.op_type, n.name or n.op_type, tuple(n.input), tuple(n.output), attrs))

    def __call__(self, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
        """Trace/run the graph. ``params`` as :attr:`params` (device arrays), ``inputs`` by name."""
        import jax.numpy as jnp

        env: dict[str, Any] = dict(self.consts)
        env.update(params)
        for name in self.input_names:
            x = jnp.asarray(inputs[name])
            env[name] = x.astype(self.compute_dtype) if x.dtype == np.float32 else x
        for node in self.nodes:
            fn = _OPS[node.op]
            args = [env[i] if i else None for i in node.inputs]
            try:
                out = fn(self, node, *args)
            except UnsupportedGraph:
                raise
            except (TypeError, ValueError, KeyError, IndexError) as exc:
                raise UnsupportedGraph(f"node {node.name!r} ({node.op}): {exc}") from exc
            outs = out if isinstance(out, tuple) else (out,)
            for name, val in zip(node.outputs, outs):
                if name:
                    env[name] = val
        return {n: jnp.asarray(env[n]).astype(self.output_dtypes[n]) for n in self.output_names}

    # helpers used by the op table
    def static(self, node: _Node, value, what: str) -> np.ndarray:
        if value is None:
            return None
        if isinstance(value, np.ndarray):
            return value
        raise UnsupportedGraph(f"node {node.name!r} ({node.op}): {what} must be an initializer or Constant")

    def mm_kwargs(self, a_dtype) -> dict:
        """``precision``/``preferred_element_type`` for dot/conv on float operands (see the policy)."""
        from jax import lax

        if np.dtype(a_dtype) == np.float32:
            return {"precision": lax.Precision.HIGHEST, "preferred_element_type": np.float32}
        if np.dtype(a_dtype).kind == "f" or str(a_dtype) == "bfloat16":
            return {"preferred_element_type": np.float32}
        return {}


# ------------------------------------------------------------------------------------------ ops
def _f32(fn: Callable):
    """Run ``fn`` in fp32 when its float input is reduced precision, cast the result back."""

    def wrapped(x, *a, **kw):
        import jax.numpy as jnp

        dt = x.dtype
        if jnp.issubdtype(dt, jnp.floating) and dt != jnp.float32 and dt != jnp.float64:
            return fn(x.astype(jnp.float32), *a, **kw).astype(dt)
        return fn(x, *a, **kw)

    return wrapped


def _binary(op):
    def run(p, node, a, b):
        import jax.numpy as jnp
        from jax import lax

        a, b = jnp.asarray(a), jnp.asarray(b)
        if a.dtype != b.dtype:  # a float constant meets a compute-dtype tensor, e.g. fp32 → fp16
            b = b.astype(a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else b
            a = a.astype(b.dtype) if jnp.issubdtype(b.dtype, jnp.floating) else a
        if op == "Div" and jnp.issubdtype(a.dtype, jnp.integer):
            a, b = jnp.broadcast_arrays(a, b)
            return lax.div(a, b)  # ONNX integer Div truncates toward zero
        return {"Add": jnp.add, "Sub": jnp.subtract, "Mul": jnp.multiply, "Div": jnp.divide}[op](a, b)

    return run


def _matmul(p, node, a, b):
    import jax.numpy as jnp

    a, b = jnp.asarray(a), jnp.asarray(b)
    return jnp.matmul(a, b, **p.mm_kwargs(a.dtype)).astype(a.dtype)


def _gemm(p, node, a, b, c=None):
    import jax.numpy as jnp

    at = node.attrs
    a, b = jnp.asarray(a), jnp.asarray(b)
    if at.get("transA", 0):
        a = a.T
    if at.get("transB", 0):
        b = b.T
    y = jnp.matmul(a, b, **p.mm_kwargs(a.dtype))  # fp32 accumulation
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        cc = jnp.asarray(c).astype(y.dtype)
        y = y + (cc * beta if beta != 1.0 else cc)
    return y.astype(a.dtype)


def _softmax(p, node, x, log=False):
    import jax

    axis = node.attrs.get("axis", -1)
    f = jax.nn.log_softmax if log else jax.nn.softmax
    return _f32(lambda v: f(v, axis=axis))(x)


def _unary(name):
    def run(p, node, x):
        import jax
        import jax.numpy as jnp

        if name == "Relu":
            return jnp.maximum(x, jnp.zeros((), x.dtype))
        if name == "LeakyRelu":
            alpha = node.attrs.get("alpha", 0.01)
            return jnp.where(x >= 0, x, x * jnp.asarray(alpha, x.dtype))
        if name == "Neg":
            return -x
        if name == "Abs":
            return jnp.abs(x)
        if name == "Sqrt":
            return jnp.sqrt(x)
        fns = {"Sigmoid": jax.nn.sigmoid, "Tanh": jnp.tanh, "Exp": jnp.exp, "Log": jnp.log,
               "Erf": jax.scipy.special.erf}
        return _f32(fns[name])(x)

    return run


def _cast(p, node, x):
    import jax.numpy as jnp

    to = node.attrs["to"]
    if to == _FLOAT:
        return jnp.asarray(x).astype(p.compute_dtype)
    if to == _BF16:
        import ml_dtypes

        return jnp.asarray(x).astype(ml_dtypes.bfloat16)
    if to not in _ONNX_DTYPES:
        raise UnsupportedGraph(f"node {node.name!r}: Cast to ONNX type {to} is not supported")
    return jnp.asarray(x).astype(_ONNX_DTYPES[to])


def _reduce(kind):
    def run(p, node, x, axes=None):
        import jax.numpy as jnp

        at = node.attrs
        if axes is None:
            axes = at.get("axes")  # opset < 13 (ReduceSum) / < 18 (ReduceMean): an attribute
        axes = p.static(node, axes, "axes") if axes is not None and not isinstance(axes, (list, tuple)) else axes
        keep = bool(at.get("keepdims", 1))
        if axes is None or len(axes) == 0:
            if at.get("noop_with_empty_axes", 0):
                return x
            ax = None
        else:
            ax = tuple(int(a) for a in np.asarray(axes).reshape(-1))
        f = jnp.sum if kind == "sum" else jnp.mean
        if jnp.issubdtype(x.dtype, jnp.floating):
            return _f32(lambda v: f(v, axis=ax, keepdims=keep))(x)
        return f(x, axis=ax, keepdims=keep).astype(x.dtype)

    return run


def _identity(p, node, x, *rest):
    return x


def _flatten(p, node, x):
    axis = node.attrs.get("axis", 1)
    shape = x.shape
    axis = axis if axis >= 0 else axis + len(shape)
    lead = int(np.prod(shape[:axis])) if axis else 1
    return x.reshape(lead, -1)


def _reshape(p, node, x, shape):
    shape = p.static(node, shape, "shape")
    new = []
    for i, d in enumerate(shape.tolist()):
        if d == 0 and not node.attrs.get("allowzero", 0):
            new.append(x.shape[i])
        else:
            new.append(int(d))
    return x.reshape(tuple(new))


def _transpose(p, node, x):
    import jax.numpy as jnp

    perm = node.attrs.get("perm")
    return jnp.transpose(x, perm)


def _unsqueeze(p, node, x, axes=None):
    import jax.numpy as jnp

    axes = node.attrs.get("axes") if axes is None else p.static(node, axes, "axes").tolist()
    out_rank = x.ndim + len(axes)
    for a in sorted(int(a) % out_rank for a in axes):
        x = jnp.expand_dims(x, a)
    return x


def _squeeze(p, node, x, axes=None):
    import jax.numpy as jnp

    axes = node.attrs.get("axes") if axes is None else p.static(node, axes, "axes").tolist()
    if axes is None:
        return jnp.squeeze(x)
    return jnp.squeeze(x, axis=tuple(int(a) % x.ndim for a in axes))


def _concat(p, node, *xs):
    import jax.numpy as jnp

    return jnp.concatenate(xs, axis=node.attrs["axis"])


def _pads_for(node, spatial: int, in_shape, kernel, strides, dilations):
    at = node.attrs
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = at.get("pads", [0] * (2 * spatial))
        return [(int(pads[i]), int(pads[i + spatial])) for i in range(spatial)]
    if auto == "VALID":
        return [(0, 0)] * spatial
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(spatial):
            size = in_shape[i]
            o = -(-size // strides[i])
            total = max((o - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size, 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            out.append((lo, total - lo))
        return out
    raise UnsupportedGraph(f"node {node.name!r}: auto_pad {auto!r} is not supported")


def _conv(p, node, x, w, b=None):
    import jax.numpy as jnp
    from jax import lax

    at = node.attrs
    spatial = x.ndim - 2
    kernel = list(at.get("kernel_shape", w.shape[2:]))
    strides = list(at.get("strides", [1] * spatial))
    dil = list(at.get("dilations", [1] * spatial))
    pads = _pads_for(node, spatial, x.shape[2:], kernel, strides, dil)
    dn = ("NCH", "OIH", "NCH") if spatial == 1 else (("NCHW", "OIHW", "NCHW") if spatial == 2 else None)
    if dn is None:
        raise UnsupportedGraph(f"node {node.name!r}: Conv with {spatial} spatial dims is not supported")
    w = jnp.asarray(w).astype(x.dtype)
    y = lax.conv_general_dilated(x, w, window_strides=strides, padding=pads, rhs_dilation=dil,
                                 dimension_numbers=dn, feature_group_count=int(at.get("group", 1)),
                                 **p.mm_kwargs(x.dtype))
    if b is not None:
        y = y + jnp.asarray(b).astype(y.dtype).reshape((1, -1) + (1,) * spatial)
    return y.astype(x.dtype)


def _pool(kind):
    def run(p, node, x):
        import jax.numpy as jnp
        from jax import lax

        at = node.attrs
        spatial = x.ndim - 2
        if kind == "global":
            return _f32(lambda v: jnp.mean(v, axis=tuple(range(2, v.ndim)), keepdims=True))(x)
        if at.get("ceil_mode", 0):
            raise UnsupportedGraph(f"node {node.name!r}: ceil_mode=1 is not supported")
        kernel = list(at["kernel_shape"])
        strides = list(at.get("strides", [1] * spatial))
        dil = list(at.get("dilations", [1] * spatial))
        pads = _pads_for(node, spatial, x.shape[2:], kernel, strides, dil)
        window = (1, 1) + tuple(kernel)
        wstrides = (1, 1) + tuple(strides)
        padding = ((0, 0), (0, 0)) + tuple(pads)
        if kind == "max":
            init = jnp.array(-jnp.inf, x.dtype)
            return lax.reduce_window(x, init, lax.max, window, wstrides, padding, window_dilation=(1, 1) + tuple(dil))
        if any(d != 1 for d in dil):
            raise UnsupportedGraph(f"node {node.name!r}: AveragePool with dilations is not supported")
        xs = x.astype(jnp.float32)
        s = lax.reduce_window(xs, 0.0, lax.add, window, wstrides, padding)
        if at.get("count_include_pad", 0) or all(lo == hi == 0 for lo, hi in pads):
            return (s / float(np.prod(kernel))).astype(x.dtype)
        ones = jnp.ones(x.shape, jnp.float32)
        n = lax.reduce_window(ones, 0.0, lax.add, window, wstrides, padding)
        return (s / n).astype(x.dtype)

    return run


def _clip(p, node, x, lo=None, hi=None):
    import jax.numpy as jnp

    if lo is None:
        lo = node.attrs.get("min")
    if hi is None:
        hi = node.attrs.get("max")
    if lo is not None:
        x = jnp.maximum(x, jnp.asarray(lo).astype(x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.asarray(hi).astype(x.dtype))
    return x


_OPS: dict[str, Callable] = {
    "Add": _binary("Add"), "Sub": _binary("Sub"), "Mul": _binary("Mul"), "Div": _binary("Div"),
    "MatMul": _matmul, "Gemm": _gemm,
    "Relu": _unary("Relu"), "LeakyRelu": _unary("LeakyRelu"), "Sigmoid": _unary("Sigmoid"), "Tanh": _unary("Tanh"),
    "Exp": _unary("Exp"), "Log": _unary("Log"), "Sqrt": _unary("Sqrt"), "Neg": _unary("Neg"), "Abs": _unary("Abs"),
    "Erf": _unary("Erf"),
    "Softmax": lambda p, n, x: _softmax(p, n, x), "LogSoftmax": lambda p, n, x: _softmax(p, n, x, log=True),
    "Cast": _cast, "ReduceSum": _reduce("sum"), "ReduceMean": _reduce("mean"),
    "Identity": _identity, "Dropout": lambda p, n, x, *r: x, "Flatten": _flatten, "Reshape": _reshape,
    "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat,
    "Conv": _conv, "MaxPool": _pool("max"), "AveragePool": _pool("avg"), "GlobalAveragePool": _pool("global"),
    "Clip": _clip,
}
assert set(_OPS) | {"Constant"} == set(OPS_SUPPORTED)
