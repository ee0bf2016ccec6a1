"""Model management from a client: load, unload and set the default model version at run time.

Sends :class:`inferbus.schemas.ModelControlRequest` to ``<p>.models.<model>.<op>`` (any ingress
of the local queue group answers) and returns the :class:`inferbus.schemas.ModelControlReply`.
No retry of a refusal: a write refused by a standby region (UNAVAILABLE naming the primary) is raised at once. A
write with no answer after half its budget is sent once more (the SDK's attempt timeout, same request id), so that an
ingress that died holding it costs half the budget, not all of it.
Semantics: docs/models.md.
"""

from __future__ import annotations

from .schemas import (MODEL_OPS, DeadlineExceeded, InvalidArgument, ModelControlReply, ModelControlRequest, decode,
                      encode)


async def model_control(client, op: str, model: str, version: str | None = None, *,
                        timeout_s: float = 60.0) -> ModelControlReply:
    """Run one model-management operation and wait for its answer.

    Args:
        client: an :class:`inferbus.client.Client` (its connection and prefix are used; its UNAVAILABLE
            retries are not).
        op: ``load``, ``unload`` or ``default``.
        model: model name. version: the model version (``load`` without one: every version on disk
            not served yet; required for ``unload`` and ``default``).
        timeout_s: budget in seconds (a ``load`` waits for every required worker to load the version).

    Returns:
        The reply: served versions, default version, the state's revision, per-worker outcome.

    Raises:
        InvalidArgument: unknown ``op``, or a model name that cannot be one subject token (empty, or holding
            ``.``, ``*``, ``>`` or whitespace), both before sending; or a request the ingress refuses (unloading
            the default version, a version that is not a number).
        NotFound: unknown model, or a version that is not on disk / not served.
        Unavailable: writes are refused in this region (not the primary), or the version is not loaded
            on every worker yet (``default``), or no ingress answers.
        DeadlineExceeded: no answer within ``timeout_s``; the message says that the operation may still have
            been applied (a slow load keeps going on the workers).
        Internal: no worker could load the version (its reason in the message).
    """
    if op not in MODEL_OPS:
        raise InvalidArgument(f"unknown model operation {op!r}; operations: {', '.join(MODEL_OPS)}", field="op")
    from .client import Client, _subject_token

    _subject_token(model, "model")  # '../etc' or 'dig.its' would address another subject, not this model
    strict = Client(client.nc, client.subjects.prefix, retry_unavailable=False)
    body = encode(ModelControlRequest(version=version))
    try:
        resp, ct = await strict.request(strict.subjects.model_control(model, op), body, timeout_s=timeout_s)
    except DeadlineExceeded as exc:  # the write went; whether it was applied is not known here
        raise DeadlineExceeded(f"{exc.message}; the {op} may still have been applied (or may still be under way): "
                               f"check with `inferbus models`") from exc
    return decode(resp, ModelControlReply, ct)
