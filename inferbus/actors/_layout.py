"""Request layouts: a body taken apart by slicing when its bytes are a known request's with other tensor values.

Clients of a model send the same request over and over with other numbers in it: the same input names,
datatypes, shapes, id and parameters, and only the tensors' ``raw`` bytes differ. In MessagePack a ``raw``
payload is a ``bin`` whose length is in its header, so two such bodies are byte for byte the same except
inside the payloads, at the same offsets. The ingress decodes and validates a body once (:func:`decode_request`
and its own checks against the model's metadata), learns where the payloads lie (:meth:`RequestLayouts.learn`),
and takes a later body of the same length whose bytes outside the payloads are the same
(:meth:`RequestLayouts.take`) by slicing: the request it gets is the one a full decode would give, its arrays
are read-only views of the sliced bytes, and its result-cache key is the one
:func:`~inferbus.actors._cache.cache_key` would give, with no decoding, validation or re-hashing of anything
but the payloads. It is the same move as a JIT's guard on a known shape: the check is a few byte comparisons,
and anything that fails it takes the full path.

Why the take is exact: MessagePack is parsed front to back, and what a byte means depends only on the bytes
before it (a ``bin`` header says how many opaque bytes follow). Two bodies that agree everywhere outside the
payload spans, with the spans at the same offsets and of the same lengths, therefore decode to the same request
except the payloads' bytes, and the checks that passed for one (names, datatypes, shapes against the model, byte
counts, sizes) pass for the other: none of them reads a value. Datatypes whose check reads values (BOOL: each
byte 0 or 1; BYTES: length-prefixed elements) are never learned. A span is learned only when the payload's
``bin`` header and bytes occur exactly once in the body, and when the real decoder, given the body with other
bytes in the spans, reads exactly those bytes as the payloads and nothing else differently (two probes): the
same bytes elsewhere, where the decoder ignores them (an unknown key, a repeated key whose later value wins),
with the real payload behind a longer ``bin`` header, are a look-alike, not a layout.
"""

from __future__ import annotations

import msgspec
import numpy as np

from ..schemas import decode_request
from ._cache import key_base, key_head, key_tail

#: The largest body (bytes) whose layout is learned; learning searches the body for each payload.
LAYOUT_MAX_BODY_BYTES = 65536
#: Layouts kept per ingress (one per model version and body length); all are dropped when it is full.
LAYOUT_MAX_ENTRIES = 256
#: Mismatches of a known (model version, body length) before its layout is learned again from a later body
#: (a client whose bodies differ outside the tensors, e.g. a fresh ``id`` in each, costs one learning per this
#: many requests).
RELEARN_AFTER_MISMATCHES = 8

_NOT_LEARNED = ("BOOL", "BYTES")
_replace = msgspec.structs.replace
_frombuffer = np.frombuffer


def _bin_header(n: int) -> bytes:
    """The MessagePack ``bin 8/16/32`` header for a payload of ``n`` bytes (the MessagePack spec, "bin format
    family"; msgspec writes the smallest that fits, as the spec asks)."""
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


_PROBE_MASKS = (0xA5, 0x3C)


def _decodes_as_spans(body: bytes, spans: list[tuple[int, int]], req) -> bool:
    """True when ``body`` with other bytes in ``spans`` decodes, by the real decoder, to ``req`` with exactly those
    bytes as its inputs' ``raw`` values (in request order) and nothing else changed, for two probes whose every
    span byte differs from the body's (XOR with each of :data:`_PROBE_MASKS`).

    The search in :meth:`RequestLayouts.learn` finds where a payload's minimal ``bin`` header and bytes occur,
    not where the decoder reads the payload: a body can carry the same bytes where the decoder ignores them (an
    unknown key, a repeated key whose later value wins) and its real payload behind a longer ``bin`` header, and
    a span there would hand the model bytes the request does not send (a fresh-user trial, 2026-12-03). The probes
    make the decoder itself say which bytes are the payloads: a look-alike span changes nothing the decoder
    keeps."""
    for mask in _PROBE_MASKS:
        probe = bytearray(body)
        for s, e in spans:
            probe[s:e] = bytes(b ^ mask for b in body[s:e])
        try:
            got = decode_request(bytes(probe))
        except Exception:
            return False
        if len(got.inputs) != len(req.inputs):
            return False
        for t, (s, e) in zip(got.inputs, spans):
            if t.raw != bytes(probe[s:e]):
                return False
        restored = _replace(got, inputs=[_replace(t, raw=o.raw) for t, o in zip(got.inputs, req.inputs)])
        if restored != req:
            return False
    return True


class Layout:
    """A validated request's bytes with its tensors' payload spans cut out.

    Attributes:
        spans: ``(start, end)`` byte offsets of each input's ``raw`` payload in the body, in request order.
        names: the inputs' names, in request order.
        tag: what the caller learned it under (e.g. the model metadata it was checked against), to compare later.
        statics: the body's bytes between the spans: before the first, between each two, after the last.
        hits: bodies taken with it; mismatches: bodies of its length it did not fit since it was learned.
    """

    __slots__ = ("spans", "statics", "_req", "_dtypes", "_dims", "out_names", "_vtag", "_key_start", "_heads",
                 "_tail", "hits", "mismatches", "_first", "_last", "_s", "_e", "_input0", "_dtype0", "_dims0",
                 "names", "tag")

    def __init__(self, body: bytes, spans: list[tuple[int, int]], req, arrays: list[np.ndarray],
                 out_names: list[str] | None, model_name: str, vtag: str | None, tag: object = None) -> None:
        self.tag = tag
        self.spans = tuple(spans)
        cuts = [0]
        for s, e in spans:
            cuts += [s, e]
        cuts.append(len(body))
        self.statics = tuple(body[cuts[i]:cuts[i + 1]] for i in range(0, len(cuts), 2))
        self._first = self.statics[0]
        self._last = self.statics[-1]
        one = len(spans) == 1 and spans[0][0] > 0  # (a span cannot start at 0: the body is a map)
        self._s, self._e = spans[0] if one else (0, 0)
        self._input0 = req.inputs[0]
        self._dtype0 = arrays[0].dtype
        self._dims0 = arrays[0].shape
        self._req = req
        self.names = tuple(t.name for t in req.inputs)
        self._dtypes = tuple(a.dtype for a in arrays)
        self._dims = tuple(a.shape for a in arrays)
        self.out_names = out_names
        self._vtag = vtag
        self._key_start = None
        self._heads = ()
        self._tail = b""
        if vtag is not None:  # the cache key's hash state up to the first payload, and the bytes around the rest
            h = key_base(model_name, vtag, True).copy()
            t0 = req.inputs[0]
            h.update(key_head(t0.name, t0.datatype, arrays[0].shape))
            self._key_start = h
            self._heads = tuple(key_head(t.name, t.datatype, a.shape) for t, a in zip(req.inputs[1:], arrays[1:]))
            self._tail = key_tail(out_names, req.parameters)
        self.hits = 0
        self.mismatches = 0

    def payloads(self, body: bytes) -> tuple[bytes, ...] | None:
        """The inputs' ``raw`` payloads of ``body`` (a body of this layout's length), in request order, as ``bytes``
        slices of it (the one copy a full decode makes too), or None when its bytes outside the spans differ."""
        s = self._s
        if s:  # one input, the common case, written out
            if body[:s] != self._first or body[self._e:] != self._last:
                self.mismatches += 1
                return None
            self.hits += 1
            return (body[s:self._e],)
        spans = self.spans
        statics = self.statics
        prev = 0
        for (s, e), static in zip(spans, statics):
            if body[prev:s] != static:
                self.mismatches += 1
                return None
            prev = e
        if body[prev:] != statics[-1]:
            self.mismatches += 1
            return None
        self.hits += 1
        return tuple(body[s:e] for s, e in spans)

    def build(self, raws: tuple[bytes, ...]):
        """``(request, [array per input])`` with payloads ``raws`` (from :meth:`payloads`): the request a full
        decode of that body gives, and its inputs as read-only arrays over the payloads (request order)."""
        req = self._req
        if self._s:
            raw = raws[0]
            return (_replace(req, inputs=[_replace(self._input0, raw=raw)]),
                    [_frombuffer(raw, self._dtype0).reshape(self._dims0)])
        inputs = [_replace(t, raw=raw) for t, raw in zip(req.inputs, raws)]
        arrays = [_frombuffer(raw, dt).reshape(dims) for raw, dt, dims in zip(raws, self._dtypes, self._dims)]
        return _replace(req, inputs=inputs), arrays

    def take(self, body: bytes):
        """``(request, [array per input], payloads)`` for ``body`` (:meth:`payloads` then :meth:`build`), or None
        when its bytes outside the spans differ."""
        raws = self.payloads(body)
        if raws is None:
            return None
        req, arrays = self.build(raws)
        return req, arrays, raws

    @property
    def request_id(self):
        """The body's ``id`` (None without one): the same in every body of the layout."""
        return self._req.id

    def cache_key(self, vtag: str, raws: tuple) -> str | None:
        """The result-cache key :func:`~inferbus.actors._cache.cache_key` gives the request with payloads
        ``raws`` (raw form) under cache version ``vtag``; None when the layout was learned under another
        version tag (a pin changed since): the caller computes it in full."""
        if vtag != self._vtag or self._key_start is None:
            return None
        h = self._key_start.copy()
        update = h.update
        update(raws[0])
        if self._heads:
            for head, raw in zip(self._heads, raws[1:]):
                update(head)
                update(raw)
        update(self._tail)
        return h.hexdigest()


class RequestLayouts:
    """The layouts an ingress learned, by (model version key, body length).

    Use: ``take`` before decoding; on None decode and validate in full, then ``learn`` from the result.
    Only MessagePack bodies (``bytes``) of at most :data:`LAYOUT_MAX_BODY_BYTES` whose every input is ``raw``
    of a fixed-size datatype other than BOOL are learned.
    """

    def __init__(self, max_entries: int = LAYOUT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._by_key: dict[tuple[str, int], Layout] = {}
        self.learned = 0

    def get(self, model_key: str, body: bytes) -> Layout | None:
        """The layout learned for ``model_key`` and bodies of ``len(body)`` bytes, if any."""
        return self._by_key.get((model_key, len(body)))

    def learn(self, model_key: str, body, req, arrays: list[np.ndarray], out_names: list[str] | None,
              model_name: str, vtag: str | None, tag: object = None) -> Layout | None:
        """Learn ``body``'s layout from its full decode ``req`` (validated; ``arrays`` its inputs' values in
        request order, ``out_names`` the requested outputs) unless a layout for its length exists, has the same
        ``tag`` and has not missed :data:`RELEARN_AFTER_MISMATCHES` bodies since it was learned. ``vtag`` is the
        model's cache version (None: the model has no result cache, and no key is prepared); ``tag`` is kept as the layout's
        :attr:`Layout.tag`. Returns the new layout, or
        None when nothing was learned (the body does not qualify, or a payload's bytes are not unique in it)."""
        if type(body) is not bytes or len(body) > LAYOUT_MAX_BODY_BYTES or not req.inputs:
            return None
        k = (model_key, len(body))
        old = self._by_key.get(k)
        if old is not None and old.mismatches < RELEARN_AFTER_MISMATCHES and old.tag is tag:
            return None
        spans = []
        prev = 0
        find = body.find
        for t in req.inputs:
            raw = t.raw
            if raw is None or t.datatype in _NOT_LEARNED or t.shm is not None or t.data is not None:
                return None
            pat = _bin_header(len(raw)) + raw
            at = find(pat)
            if at < prev or find(pat, at + 1) >= 0:
                return None  # absent (not a bin), out of order or not unique: the span could be a look-alike
            start = at + len(pat) - len(raw)
            spans.append((start, start + len(raw)))
            prev = start + len(raw)
        if not _decodes_as_spans(body, spans, req):
            return None
        if old is None and len(self._by_key) >= self.max_entries:
            self._by_key.clear()
        layout = Layout(body, spans, req, arrays, out_names, model_name, vtag, tag)
        self._by_key[k] = layout
        self.learned += 1
        return layout

    def stats(self) -> dict:
        """``{"entries": layouts kept, "learned": layouts learned in all, "taken": bodies taken by the layouts
        kept}`` (read at scrape time; nothing is counted per request beyond each layout's ``hits``)."""
        return {"entries": len(self._by_key), "learned": self.learned,
                "taken": sum(lay.hits for lay in self._by_key.values())}

    def clear(self) -> None:
        self._by_key.clear()

    def forget(self, model_name: str) -> None:
        """Drop every layout of model ``model_name``'s versions (keys ``<name>:<version>``): their bodies were
        validated against metadata that a model-state change (a re-pin, a load, a withdrawal) may have replaced."""
        prefix = model_name + ":"
        for k in [k for k in self._by_key if k[0].startswith(prefix)]:
            del self._by_key[k]

    def __len__(self) -> int:
        return len(self._by_key)
