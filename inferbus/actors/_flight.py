"""What a worker process was computing when it died: a small file the worker maps and the node reads after a crash.

A worker writes, before each model run, which forwarded requests the run holds (``(ingress id, forward sequence
number)`` each) into its slot of the file, and empties the slot when the run returns. The file is mapped shared
(``mmap``), so each write is a copy into the page cache: no system call on the request path, and what was written
survives the process (a SIGFPE or SIGSEGV inside the runtime, a SIGKILL) for the node to read when it sees the exit
(:meth:`inferbus.actors._node.Node._on_exit`). The node puts the requests in its ``ProcessEvent`` (``running``), and
each ingress counts the crash against those requests only, not against every request it had forwarded to the worker
(queued ones, another model's): see :meth:`inferbus.actors._ingress.Ingress._note_deaths`.

A request a colocated ingress handed to its worker in-process (``--colocate``) dies with that ingress, whose forward
sequence numbers mean nothing to anyone else: for it the worker writes ``[model version key, request id or "", body]``
instead (the body as it came, copied into the file with the entry; no digest on the request path), and the node
passes its digest on in the event (``running_local``, :func:`inferbus.actors._crashes.request_digest`), so that the
*other* ingresses know the request that killed the process (a query of death carried from process to process by the
client's retries).

Two slots: the inference thread's and the event loop's (a model run inline, :attr:`Job.inline`), which can run at
the same time. Each slot is a 4-byte little-endian length then a MessagePack array of entries, each
``[ingress, seq]`` or ``[model key, request id, body]``, or one such entry alone; length 0 is an empty slot,
:data:`_UNKNOWN` a run whose entries did not fit (the reader then knows nothing of it). The length is written last
and cleared first, so a reader never takes a half-written list for a whole one.

A black-box recorder of this kind is an old technique (a process's "flight recorder"); the file format is our own.
"""

from __future__ import annotations

import mmap
import os
import struct

import msgspec

SLOT_BYTES = 256 * 1024
"""Bytes per slot: a run of 256 forwarded requests (the inference thread's largest) with 60-character ingress ids
fits, and in-process requests whose bodies add up to about 256 KiB; a run that does not fit is recorded as not
known. The file is sparse: only what a run writes is touched."""
SLOTS = 2
THREAD_SLOT = 0
LOOP_SLOT = 1
_UNKNOWN = 0xFFFFFFFF
_ROOM = SLOT_BYTES - 4
_LOOP_BASE = LOOP_SLOT * SLOT_BYTES
_LOOP_DATA = _LOOP_BASE + 4
_LEN = struct.Struct("<I")
_pack_len = _LEN.pack_into
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode  # entries of two shapes, checked by read_flight_record


class FlightRecorder:
    """The worker's side: :meth:`record` before a model run, :meth:`clear` after it.

    Args:
        path: the file (created or truncated, mode 0600; the node names it and reads it after the process exits).

    Raises:
        OSError: the file cannot be created or mapped.
    """

    __slots__ = ("_map", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOT_BYTES * SLOTS)
            self._map = mmap.mmap(fd, SLOT_BYTES * SLOTS)
        finally:
            os.close(fd)

    def record(self, slot: int, pairs) -> None:
        """Say that the run starting now on ``slot`` holds ``pairs``: a list or tuple of entries, each
        ``(ingress id, seq)``, or ``(model version key, request id or "", body bytes)`` for a request handed over
        in-process. The slot must be clear (new, or :meth:`clear` since the last record): its length is written
        after the entries. About 0.6 µs for one pair, 0.8 µs with its :meth:`clear` (2-core box)."""
        data = _encode(pairs)
        n = len(data)
        base = slot * SLOT_BYTES
        if n > SLOT_BYTES - 4:
            _pack_len(self._map, base, _UNKNOWN)
            return
        self._map[base + 4:base + 4 + n] = data
        _pack_len(self._map, base, n)

    def clear(self, slot: int) -> None:
        """The run on ``slot`` returned (whatever its outcome)."""
        _pack_len(self._map, slot * SLOT_BYTES, 0)

    def note(self, model_key: str, rid: str, body: bytes) -> None:
        """:meth:`record` of the loop's slot for one request handed over in-process (the colocated ingress's lone
        miss, its hot path), in fewer steps: the entry alone, not in a list (the reader takes either). Cleared by
        :meth:`clear_loop`."""
        data = _encode((model_key, rid, body))
        n = len(data)
        m = self._map
        if n > _ROOM:
            _pack_len(m, _LOOP_BASE, _UNKNOWN)
            return
        m[_LOOP_DATA:_LOOP_DATA + n] = data
        _pack_len(m, _LOOP_BASE, n)

    def clear_loop(self) -> None:
        """:meth:`clear` of the loop's slot."""
        _pack_len(self._map, _LOOP_BASE, 0)

    def close(self) -> None:
        self._map.close()


def read_flight_record(path: str) -> list[tuple] | None:
    """The entries of the runs that were under way in the process that wrote ``path`` (both slots): ``(ingress id,
    seq)`` of a forwarded request, ``(model version key, request id or "", body)`` of one handed over in-process;
    or None when that is not known: no such file (a worker started without one), a file of another size, a run
    that did not fit its slot, or a slot that does not decode or holds an entry of neither shape. An empty list: the
    process was computing nothing (it died, or was killed, between runs)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(SLOT_BYTES * SLOTS + 1)
    except OSError:
        return None
    if len(data) != SLOT_BYTES * SLOTS:
        return None
    out: list[tuple] = []
    for slot in range(SLOTS):
        base = slot * SLOT_BYTES
        (n,) = _LEN.unpack_from(data, base)
        if n == 0:
            continue
        if n == _UNKNOWN or n > SLOT_BYTES - 4:
            return None
        try:
            entries = _decode(data[base + 4:base + 4 + n])
        except msgspec.DecodeError:
            return None
        if not isinstance(entries, list):
            return None
        if len(entries) == 3 and isinstance(entries[0], str):  # one entry alone (FlightRecorder.note)
            entries = [entries]
        for e in entries:
            if not isinstance(e, list):
                return None
            if len(e) == 2 and isinstance(e[0], str) and type(e[1]) is int:
                out.append((e[0], e[1]))
            elif len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str) and isinstance(e[2], bytes):
                out.append((e[0], e[1], e[2]))
            else:
                return None
    return out
