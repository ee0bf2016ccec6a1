"""Result cache keys and the in-process L1 cache (DESIGN §6).

The key is a BLAKE2b-128 digest of everything that changes the answer: model
name and version, every input's name, datatype, shape and bytes (in request
order), the requested outputs, the output form (raw or data) and the request
parameters. A new model version therefore never sees an old version's entry,
and the same bytes sent as FP32[2,3], FP32[3,2] or INT32[2,3] are three keys.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

import msgspec
import numpy as np

from ..schemas import InvalidArgument, parameter_field

_enc = msgspec.msgpack.Encoder(order="deterministic")


_prefixes: dict[tuple, "hashlib._Hash"] = {}
"""(model, version, raw_form) → a BLAKE2b state that has hashed the key's model prefix (copied per key)."""
_heads: dict[tuple, bytes] = {}
"""(input name, datatype, shape) → the bytes hashed before that input's values."""
_MAX_MEMO = 4096


def key_base(model: str, version: str, raw_form: bool) -> "hashlib._Hash":
    """The BLAKE2b-128 state that has hashed a key's model prefix (model, version, output form); memoized, so
    copy it before updating it."""
    pk = (model, version, raw_form)
    base = _prefixes.get(pk)
    if base is None:
        base = hashlib.blake2b(digest_size=16)
        base.update(f"{model}\0{version}\0{int(raw_form)}\0".encode())
        if len(_prefixes) >= _MAX_MEMO:
            _prefixes.clear()
        _prefixes[pk] = base
    return base


def key_head(name: str, datatype: str, shape: tuple) -> bytes:
    """The bytes a key hashes before one input's values: its name, datatype and shape (memoized)."""
    hk = (name, datatype, shape)
    head = _heads.get(hk)
    if head is None:
        head = f"{name}\0{datatype}\0{','.join(map(str, shape))}\0".encode()
        if len(_heads) >= _MAX_MEMO:
            _heads.clear()
        _heads[hk] = head
    return head


def key_tail(outputs: list[str] | None, parameters: dict | None) -> bytes:
    """The bytes a key hashes after the last input: the requested outputs and the request parameters.

    Raises:
        InvalidArgument: ``parameters`` holds an integer MessagePack cannot carry (below -2**63 or above
            2**64 - 1; only a JSON body can hold one), ``field`` ``parameters["<name>"]`` (it was INTERNAL: a
            fresh-user trial, 2026-12-05).
    """
    tail = b"\0out\0" + ",".join(outputs).encode() if outputs else b"\0out\0"
    if parameters:
        try:
            tail += b"\0par\0" + _enc.encode(parameters)
        except OverflowError:
            name = next((k for k, v in parameters.items() if type(v) is int and not -2**63 <= v < 2**64), None)
            field = "parameters" if name is None else parameter_field(name)
            raise InvalidArgument(f"{field}: an integer is outside the 64-bit range (-2**63 to 2**64 - 1)",
                                  field=field) from None
    return tail


def cache_key(model: str, version: str, inputs: list, arrays: list[np.ndarray], outputs: list[str] | None,
              raw_form: bool, parameters: dict | None) -> str:
    """Hex key (32 chars) for a request; ``inputs`` are the request's tensors, ``arrays`` their decoded values.

    The digest is the same as hashing everything from scratch: :func:`key_base`, then per input
    :func:`key_head` and its values (the ``raw`` bytes as sent; BYTES as length-prefixed elements; else the
    array's row-major bytes), then :func:`key_tail`. The model prefix's hash state and each head are memoized.
    """
    h = key_base(model, version, raw_form).copy()
    update = h.update
    for t, arr in zip(inputs, arrays):
        update(key_head(t.name, t.datatype, arr.shape))
        if t.raw is not None:
            update(t.raw)
        elif arr.dtype == object:
            for item in arr.ravel():
                update(len(item).to_bytes(4, "little"))
                update(item)
        else:
            update(np.ascontiguousarray(arr).data)
    update(key_tail(outputs, parameters))
    return h.hexdigest()


class L1Cache:
    """A bounded LRU of encoded responses with per-entry expiry (monotonic seconds).

    Args:
        capacity: entries kept at most; the least recently used goes first.
        max_bytes: bytes of values (``len`` of each value as put) kept at most, 0 for no byte bound; the least
            recently used go first, and a value larger than the bound is not kept. Answers of several MB
            (large batches) would otherwise hold ``capacity`` × their size.
    """

    def __init__(self, capacity: int = 10_000, max_bytes: int = 0) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        """Bytes held (the values' sizes as put)."""
        self._data: OrderedDict[str, tuple[float, object, int]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: str, now: float | None = None):
        entry = self._data.get(key)
        if entry is None:
            self.misses += 1
            return None
        now = time.monotonic() if now is None else now
        if entry[0] < now:
            del self._data[key]
            self.bytes -= entry[2]
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return entry[1]

    def put(self, key: str, value, ttl_ms: float, now: float | None = None) -> None:
        if self.capacity <= 0 or ttl_ms <= 0:
            return
        data = self._data  # locals: this runs twice per miss (the raw index and L1)
        size = len(value) if isinstance(value, (bytes, bytearray, memoryview)) else 0
        old = data.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        max_bytes = self.max_bytes
        if max_bytes and size > max_bytes:
            return
        data[key] = ((time.monotonic() if now is None else now) + ttl_ms / 1000.0, value, size)
        if size:  # the raw index's values are tuples (size 0)
            self.bytes += size
        while len(data) > self.capacity or (max_bytes and self.bytes > max_bytes):
            self.bytes -= data.popitem(last=False)[1][2]

    def replace(self, key: str, value) -> None:
        """Swap the value of a live entry (its expiry, LRU position and counted size unchanged); no-op when
        ``key`` is absent."""
        entry = self._data.get(key)
        if entry is not None:
            self._data[key] = (entry[0], value, entry[2])

    def __len__(self) -> int:
        return len(self._data)
