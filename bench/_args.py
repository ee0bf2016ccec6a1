"""argparse value types for the bench commands: each rejects a bad value with a message that says what is
expected (argparse otherwise names the converter, e.g. ``invalid _positive_int value``), in the words of the
``inferbus`` command's refusals: ``must be a finite number > 0, got -5``, a number echoed as
:func:`inferbus._limits.number_as_typed` writes it (``got -5``, not ``got '-5'``), text that is no number quoted."""

from __future__ import annotations

import argparse

from inferbus._limits import number_as_typed


def _number(text: str, kind: type, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} expected, got {text!r}") from None


def count(text: str) -> int:
    """An integer >= 1 (a number of processes, steps, pairs...)."""
    n = _number(text, int, "an integer")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {n}")
    return n


def count_or_zero(text: str) -> int:
    """An integer >= 0 (0 meaning the option's default)."""
    n = _number(text, int, "an integer")
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {n}")
    return n


def positive(text: str) -> float:
    """A number > 0 (seconds, rates, µs)."""
    x = _number(text, float, "a number")
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {number_as_typed(x)}")
    return x


def non_negative(text: str) -> float:
    """A finite number >= 0."""
    x = _number(text, float, "a number")
    if not 0 <= x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {number_as_typed(x)}")
    return x


def above_one(text: str) -> float:
    """A number > 1 (a growth factor)."""
    x = _number(text, float, "a number")
    if not 1 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 1, got {number_as_typed(x)}")
    return x


def counts(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers >= 1, e.g. ``1,8,64``."""
    out = tuple(count(x) for x in text.split(",") if x.strip())
    if not out:
        raise argparse.ArgumentTypeError("a comma-separated list of integers >= 1 expected, e.g. 1,8,64")
    return out


def rates(text: str) -> tuple[float, ...]:
    """A comma-separated list of numbers > 0, e.g. ``1000,5000``."""
    out = tuple(positive(x) for x in text.split(",") if x.strip())
    if not out:
        raise argparse.ArgumentTypeError("a comma-separated list of numbers > 0 expected, e.g. 1000,5000")
    return out


def cpu_list(text: str) -> tuple[int, ...]:
    """A Linux CPU list (``taskset -c`` / cpuset syntax), e.g. ``11-15`` or ``0,2,8-11``, of cores this host has
    (:func:`inferbus._cpus.parse_cpu_list`). Returns the cores, sorted."""
    from inferbus._cpus import parse_cpu_list

    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
