"""``python -m inferbus.loadgen gen|echo '<config JSON>'``: the child processes of GeneratorPool / EchoPool."""

import sys

from ._procs import echo_main, gen_main


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("gen", "echo"):
        sys.exit("usage: python -m inferbus.loadgen gen|echo '<config JSON>'")
    (gen_main if argv[0] == "gen" else echo_main)(argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
