"""``python -m inferbus.actors KIND CONFIG_JSON``: the entry point of every actor process.

An actor that cannot start because its model repository cannot be served (a ``RepositoryError``: the
repository changed since ``inferbus up`` checked it, or a worker's runtime refused a model version) prints
one line starting with ``UNSERVABLE_PREFIX`` and exits 2, which ``inferbus up`` reports as that line.
"""

import sys


def _main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("worker", "ingress", "aggregator", "region", "colocated"):
        sys.exit("usage: python -m inferbus.actors {worker|ingress|aggregator|region|colocated} CONFIG_JSON")
    kind, cfg = sys.argv[1], sys.argv[2]
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
