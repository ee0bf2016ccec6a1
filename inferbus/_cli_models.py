"""``inferbus models``: list the served models; load, unload and set the default model version at run time.

``inferbus models [--timeout-s S]``          the served models (a table: versions, default version, platform,
                                             inputs, outputs; from their OIP v2 metadata; one request, budget
                                             S seconds, default 1);
``inferbus models load NAME [V]``           load a version from the model repository folder (all versions
                                             on disk not served yet without one);
``inferbus models unload NAME V``            drain and drop a version (not the default);
``inferbus models default NAME V``           the version that serves requests naming none.

Each takes the version either way, as the second argument or as ``--version V`` (the same value if both), and
its budget as ``--timeout-s S`` after the subcommand (default 60 s; ``--timeout`` is the older name).

``--nats-url`` and ``--prefix`` may come before the subcommand (``inferbus models --nats-url URL default
digits 2``) or after it; given after, they win. Writes go to ``<p>.models.<model>.<op>`` at the ingress that answers
``<p>.ingresses`` first, so a hung one costs nothing (:func:`inferbus.model_admin.model_control`; docs/models.md);
a refused write prints its typed error on one line and exits 2 (1 for UNAVAILABLE or DEADLINE_EXCEEDED: the
deployment could not do it, e.g. no ingress answering or a rival write won); unreachable NATS prints one line naming
the URL and exits 3.
"""

from __future__ import annotations

from typing import Optional

import typer

from ._limits import MAX_TIMEOUT_MS, interval

app = typer.Typer(add_completion=False, invoke_without_command=True,
                  help="Served models; load, unload and default model versions at run time.",
                  short_help="List the served models; load, unload and pick versions.")

_NATS = typer.Option("nats://127.0.0.1:4222", help="NATS server(s), comma-separated.")
_PREFIX = typer.Option("inferbus", help="Subject prefix.")
# a subcommand's own options default to None: then the group's (given before the subcommand) apply
_SUB_NATS = typer.Option(None, help="NATS server(s), comma-separated (default: the group's --nats-url, "
                         "nats://127.0.0.1:4222).")
_SUB_PREFIX = typer.Option(None, help="Subject prefix (default: the group's --prefix, inferbus).")
_TIMEOUT = typer.Option(60.0, "--timeout-s", "--timeout",
                        help=f"Budget of the write in seconds, in {interval(0, MAX_TIMEOUT_MS / 1000, lo_open=True)} (a "
                        "load waits for every worker); "
                        "--timeout is the older name of the same option.")


@app.callback()
def models(ctx: typer.Context, nats_url: str = _NATS, prefix: str = _PREFIX,
           as_json: bool = typer.Option(False, "--json", help="Print the listing as JSON: the OIP v2 model list, "
                                        "{\"models\": <a list of model metadata>} (each with "
                                        "parameters.default_version)."),
           timeout_s: float = typer.Option(1.0, help="Budget of the listing in seconds, retries included, in "
                                           f"{interval(0, MAX_TIMEOUT_MS / 1000, lo_open=True)}; "
                                           "a write takes --timeout-s after its subcommand.")):
    """List the served models with their inputs and outputs (OIP v2 metadata)."""
    from .cli import _call, _check_timeout_s, _given, _left_s, _nats_urls_given, _one_shot_client, _usage, console

    _nats_urls_given("models", nats_url)
    if ctx.invoked_subcommand is not None:
        if _given(ctx, "timeout_s"):  # not the write's budget (60 s by default): refused rather than ignored
            _usage(f"models {ctx.invoked_subcommand}: --timeout-s is the listing's budget; give the write's after "
                   f"the subcommand: inferbus models {ctx.invoked_subcommand} ... --timeout-s SECONDS")
        ctx.obj = {"nats_url": nats_url, "prefix": prefix}  # the subcommands' connection unless they get their own
        return
    from rich.table import Table

    from ._wrap import FittedTable

    _check_timeout_s("models", timeout_s)

    async def go():
        import time

        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        async with await _one_shot_client(nats_url, prefix, timeout_s=timeout_s) as c:
            return await c.models(timeout_s=_left_s(t_end))

    ml = _call(go, as_json=as_json)
    if as_json:
        import msgspec

        print(msgspec.json.encode(ml).decode())
        return
    t = Table()
    # a version some worker does not serve because its files are not those it was pinned to (docs/models.md)
    problems = {m.name: (m.parameters or {}).get("versions_not_served") or {} for m in ml.models}
    described = any((m.parameters or {}).get("description") for m in ml.models)
    hedged = any((m.parameters or {}).get("hedge_after_ms") is not None for m in ml.models)
    cols = ("name", "versions", "default", "platform", "inputs", "outputs", "max batch", "cache ttl ms") + (
        ("hedge after",) if hedged else ()) + (("description",) if described else ()) + (
        ("not served",) if any(problems.values()) else ())
    for col in cols:
        t.add_column(col)
    # on a terminal too narrow for the table (most are: its natural width is ~200 columns), name=value blocks
    fitted = FittedTable(t, "models", wrap_cells=True)
    fmt = lambda ts: ", ".join(f"{x.name} {x.datatype}{x.shape}" for x in ts)  # noqa: E731
    for m in ml.models:  # the default version: what a request naming none is served by (metadata parameters)
        mp = m.parameters or {}
        default = str(mp.get("default_version", ""))
        row = [m.name, ",".join(m.versions), default, m.platform, fmt(m.inputs), fmt(m.outputs),
               str(mp.get("max_batch_size", "")), str(mp.get("cache_ttl_ms", ""))]
        if hedged:
            row.append(str(mp.get("hedge_after_ms", "")))
        if described:
            row.append(str(mp.get("description", "")))
        if len(cols) > len(row):
            row.append(",".join(sorted(problems[m.name], key=lambda v: (len(v), v))))
        fitted.add_row(*row)
    console.print(fitted)
    for name, probs in problems.items():  # why, one line each, unwrapped (a digest is 71 characters)
        for line in _not_served(name, probs):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _not_served(name: str, problems: dict) -> list[str]:
    """One line per version of ``name`` in ``problems`` (metadata ``parameters.versions_not_served``):
    ``digits version 2 NOT READY (no worker serves it): digest mismatch: expected sha256:... got sha256:... (n1-w0,
    n1-w1)``, or ``... not served by n1-w0 (others serve it): ...`` while other workers serve it."""
    lines = []
    for v, p in sorted(problems.items(), key=lambda kv: (len(kv[0]), kv[0])):
        workers = p.get("workers") or {}
        why = next(iter(workers.values()), "")
        # the reason without the "model 'm' version v: " lead and the advice after the folder
        why = why.split(f"version {v}: ", 1)[-1].split(" (", 1)[0]
        who = ", ".join(sorted(workers))
        lines.append(f"{name} version {v} not served by {who} (other workers serve it): {why}" if p.get("ready") else
                     f"{name} version {v} NOT READY (no live worker serves it): {why} ({who})")
    return lines


def _write(ctx: typer.Context, op: str, name: str, version: Optional[str], nats_url: Optional[str],
           prefix: Optional[str], timeout_s: float, as_json: bool) -> None:
    from .cli import _call, _check_timeout_s, _left_s, _nats_urls_given, _one_shot_client, _timeout_s_as_typed, console
    from .model_admin import model_control

    _check_timeout_s(f"models {op}", timeout_s, _timeout_s_as_typed())  # (--timeout 0 said "--timeout-s must be")
    group = ctx.obj or {}
    if nats_url is not None:  # '' was the group's URL (the default one): refused, as the group refuses it
        _nats_urls_given(f"models {op}", nats_url)
    else:
        nats_url = group.get("nats_url", "nats://127.0.0.1:4222")
    prefix = prefix or group.get("prefix", "inferbus")

    async def go():
        import time

        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        async with await _one_shot_client(nats_url, prefix, timeout_s=timeout_s) as c:
            return await model_control(c, op, name, version, timeout_s=_left_s(t_end))

    r = _call(go, as_json=as_json)
    if as_json:  # every field, also those at their default (the wire omits them): the same keys every time
        import json

        console.print_json(json.dumps({f: getattr(r, f) for f in r.__struct_fields__}))
        return
    what = f"{op} {name}" + (f" version {r.version}" if r.version else "")
    state = "done" if r.changed else "nothing to do"
    serving = (f"serving versions {','.join(r.versions)}, default {r.default_version}" if r.versions
               else f"model {name} not served")  # its last version unloaded
    console.print(f"{what}: {state} in {r.elapsed_ms:.1f} ms; {serving} (revision {r.revision})", markup=False,
                  highlight=False)
    for wid, outcome in sorted(r.workers.items()):
        console.print(f"  {wid}: {outcome}", markup=False, highlight=False)


def _version(op: str, positional: Optional[str], option: Optional[str], required: bool) -> Optional[str]:
    """The version a write names: the second argument or ``--version`` (a user who typed ``unload digits 2`` or
    ``default digits --version 2`` meant it; fresh-user trials tried both).

    Raises:
        typer.BadParameter: both given and different, or neither while ``required`` (exit 2, usage error).
    """
    if positional is not None and option is not None and positional != option:
        raise typer.BadParameter(f"two different versions: {positional!r} and --version {option!r}; give one",
                                 param_hint="VERSION")
    version = positional if positional is not None else option
    if version is None and required:
        raise typer.BadParameter(f"{op} needs a version: inferbus models {op} NAME VERSION (or --version VERSION)",
                                 param_hint="VERSION")
    return version


@app.command(short_help="Load a model version on every worker.")
def load(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME", help="Model name."),
         version_arg: Optional[str] = typer.Argument(None, metavar="VERSION", show_default=False,
                                                     help="Version to load (default: every version on disk not "
                                                     "served yet); or --version."),
         version: Optional[str] = typer.Option(None, help="Same as VERSION."),
         nats_url: Optional[str] = _SUB_NATS, prefix: Optional[str] = _SUB_PREFIX, timeout_s: float = _TIMEOUT,
         as_json: bool = typer.Option(False, "--json", help="Print the reply as JSON.")):
    """Load a model version from the repository folder on every worker; returns when they have it."""
    _write(ctx, "load", name, _version("load", version_arg, version, False), nats_url, prefix, timeout_s, as_json)


@app.command(short_help="Stop serving a model version.")
def unload(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME", help="Model name."),
           version_arg: Optional[str] = typer.Argument(None, metavar="VERSION", show_default=False,
                                                       help="Version to unload (not the default while others are served; the last one withdraws the model); or --version."),
           version: Optional[str] = typer.Option(None, help="Same as VERSION."),
           nats_url: Optional[str] = _SUB_NATS, prefix: Optional[str] = _SUB_PREFIX, timeout_s: float = _TIMEOUT,
           as_json: bool = typer.Option(False, "--json", help="Print the reply as JSON.")):
    """Stop serving a version: refused at once by the ingresses, drained and dropped by the workers; a model's last
    version withdraws the model (NOT_FOUND, unlisted) until `models load` serves it again."""
    _write(ctx, "unload", name, _version("unload", version_arg, version, True), nats_url, prefix, timeout_s, as_json)


@app.command(short_help="Make VERSION the default version of NAME.")
def default(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME", help="Model name."),
            version_arg: Optional[str] = typer.Argument(None, metavar="VERSION", show_default=False,
                                                        help="Version that serves requests naming none; or "
                                                        "--version."),
            version: Optional[str] = typer.Option(None, help="Same as VERSION."),
            nats_url: Optional[str] = _SUB_NATS, prefix: Optional[str] = _SUB_PREFIX, timeout_s: float = _TIMEOUT,
            as_json: bool = typer.Option(False, "--json", help="Print the reply as JSON.")):
    """Make VERSION the default version of NAME (it must be loaded on every worker serving NAME)."""
    _write(ctx, "default", name, _version("default", version_arg, version, True), nats_url, prefix, timeout_s,
           as_json)
