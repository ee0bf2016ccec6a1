"""``python -m inferbus.actors KIND CONFIG_JSON|@FILE [--log-level L] [--log-format F] [--log-actor NAME]``: the entry
point of every actor process.

Logging is set up first (:func:`inferbus._logs.configure_actor_process`): records at ``--log-level`` (debug, info,
warning, error; default info) and above go to stderr in ``--log-format`` (text or json; default text), the ``actor``
field of the JSON format being ``--log-actor`` (default KIND). The node passes its own ``--log-level`` and
``--log-format`` and names each process as its NATS connection is named (``worker-n1-w0``, ``ingress-n1-i0``).

An actor that cannot start because its model repository cannot be served (a ``RepositoryError``: the
repository changed since ``inferbus up`` checked it, or a worker's runtime refused a model version) prints
one line starting with ``UNSERVABLE_PREFIX`` and exits 2, which ``inferbus up`` reports as that line.
"""

import argparse
import sys

KINDS = ("worker", "ingress", "aggregator", "region", "colocated", "http")


def _main() -> None:
    from .._limits import LOG_FORMATS, LOG_LEVELS

    parser = argparse.ArgumentParser(prog="python -m inferbus.actors")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("config", metavar="CONFIG_JSON|@FILE")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    parser.add_argument("--log-actor", default=None, help="the JSON format's actor field (default: KIND)")
    args = parser.parse_args()
    from .._logs import configure_actor_process

    configure_actor_process(args.log_level, args.log_format, args.log_actor or args.kind)
    kind, cfg = args.kind, args.config
    if cfg.startswith("@"):  # the node passes a 0600 file (configs may hold credentials; argv is public)
        with open(cfg[1:]) as fh:
            cfg = fh.read()
    if kind == "worker":
        from ._worker import main
    elif kind == "ingress":
        from ._ingress import main
    elif kind == "region":
        from ._region import main
    elif kind == "colocated":
        from ._colocated import main
    elif kind == "http":
        from ._httpproc import main
    else:
        from ._aggregator import main
    from ._repository import UNSERVABLE_PREFIX, RepositoryError

    try:
        main(cfg)
    except RepositoryError as exc:
        print(f"{UNSERVABLE_PREFIX}{' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    _main()
