"""The hedge policy of a model (``hedge_after_ms`` in its ``config.json``) or of one request (the
``Inferbus-Hedge`` header): its forms and its parser, shared by the ingress, the model repository and the
SDK (which refuses a bad one before sending). What a policy does: :mod:`inferbus.actors._hedge`."""

from __future__ import annotations


class HedgePolicyError(ValueError):
    """A hedge policy that is not ``off``, a positive number of ms or ``pNN``/``auto``."""


def parse_policy(value) -> tuple[str, float] | None:
    """Parse a hedge policy.

    Returns:
        None for no hedging; ``("fixed", ms)``; or ``("quantile", q)`` with q in (0, 1).

    Raises:
        HedgePolicyError: anything else (the message gives the allowed forms).
    """
    if value is None or value is False:
        return None
    if isinstance(value, bool):
        raise HedgePolicyError("hedge policy: use 'off', a number of ms > 0, 'pNN' or 'auto'")
    if isinstance(value, (int, float)):
        ms = float(value)
    else:
        text = str(value).strip().lower()
        if text in ("", "off", "none", "no"):
            return None
        if text == "auto":
            return ("quantile", 0.95)
        if text.startswith("p"):
            try:
                q = float(text[1:]) / 100.0
            except ValueError:  # not a quantile at all (e.g. 'primary')
                raise HedgePolicyError(
                    f"hedge policy {value!r}: use 'off', a number of ms > 0, 'pNN' (e.g. p95) or 'auto'") from None
            if not 0.0 < q < 1.0:
                raise HedgePolicyError(f"hedge policy {value!r}: a quantile is pNN with 0 < NN < 100 (e.g. p95, "
                                       f"p99.9)")
            return ("quantile", q)
        try:
            ms = float(text)
        except ValueError:
            raise HedgePolicyError(
                f"hedge policy {value!r}: use 'off', a number of ms > 0, 'pNN' (e.g. p95) or 'auto'") from None
    if not ms > 0 or ms != ms or ms == float("inf"):
        raise HedgePolicyError(f"hedge policy {value!r}: a delay must be a finite number of ms > 0")
    return ("fixed", ms)
