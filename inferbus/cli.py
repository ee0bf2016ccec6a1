"""The ``inferbus`` command (typer + rich).

``inferbus up``       serve in the foreground (embedded NATS + Valkey unless URLs are given);
``inferbus up --demo`` also run a short checked load run and exit (non-zero on any wrong answer);
``inferbus infer``    one request from .npy files;
``inferbus models``   the served models' metadata; ``models load|unload|default`` manage versions at run time;
``inferbus health``   an ingress's live/ready answer;
``inferbus bench``    closed- and open-loop load with HDR percentiles, every answer checked.

Exit status of every command that talks to a deployment: 0 done; 1 the operation ran and failed (wrong
answers, not ready, refused by a region manager, a typed UNAVAILABLE or DEADLINE_EXCEEDED reply); 2 usage or another
typed error reply (bad option or file, INVALID_ARGUMENT, NOT_FOUND, ...); 3 cannot reach NATS (one line naming the servers, no traceback). Every command: 141
(128 + SIGPIPE) its stdout or stderr was a pipe its reader had closed (``| head -1``), no message (see main()).
"""

from __future__ import annotations

import signal
import sys


def _sigint_while_loading(signum, frame) -> None:
    """SIGINT while this module loads (its imports, then its ~1,700 lines of definitions): exit 130 with no traceback,
    as a shell reports a SIGINT death; the module's last line puts Python's handler back. A KeyboardInterrupt raised
    in the definitions after the imports' ``try`` printed a traceback (a CI run: ``cluster up`` SIGINTed at 0.2 s)."""
    raise SystemExit(128 + signal.SIGINT)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()  # (signal.signal works there only)


try:  # a Ctrl-C from here until the module is loaded exits 130, no traceback (see main())
    if not _main_thread():
        pass
    elif signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _sigint_while_loading)
    elif signal.getsignal(signal.SIGINT) is signal.SIG_IGN and \
            next((a for a in sys.argv[1:] if not a.startswith("-")), None) in ("up", "bench", "cluster"):
        # `up`, `bench` and `cluster` (its `up`) handle SIGINT even when it came in ignored (a background job of a non-interactive
        # shell): from here, not only once `up`'s loop's handlers are in (~1.5 s later), so that a `kill -INT`
        # during the imports and the option checks stops it (130) as it does one whose SIGINT was not ignored
        # (fresh-user trials: such a signal was lost and the node started and served; a background `bench` ran
        # its whole 20 s). Inside the try: a SIGINT that lands right after the handler is set exits 130 too (a CI
        # run: it came before the try, and the process died of SIGINT, -2)
        signal.signal(signal.SIGINT, _sigint_while_loading)
except KeyboardInterrupt:
    raise SystemExit(128 + signal.SIGINT) from None

if __name__ == "__main__":
    # `python -m inferbus.cli`: run the app of the module imported as inferbus.cli, so the subcommand modules (which
    # import inferbus.cli) and the command share one NatsUnreachable class and one _run; and nothing below runs here
    # (it ran twice, as __main__ and then as inferbus.cli: ~30 ms of every command). The SIGINT handler just set stays
    # in while inferbus.cli loads (compiled first on a fresh clone, ~0.3 s): with Python's back, a SIGINT then was a
    # KeyboardInterrupt traceback from the import (a CI run, `cluster up` at 0.2 s)
    try:
        from inferbus.cli import main as _main
    except KeyboardInterrupt:  # (a SIGINT that came before this module's handler was in)
        raise SystemExit(128 + signal.SIGINT) from None
    if signal.getsignal(signal.SIGINT) is _sigint_while_loading:  # loaded: a Ctrl-C is a KeyboardInterrupt again
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(_main())  # (main() exits itself)

try:  # typer and rich, ~0.1 s; what only some commands need (asyncio, nats-py, numpy, the actors) they import
    import errno
    import json
    import math
    import os
    import re
    from dataclasses import replace
    from pathlib import Path
    from typing import TYPE_CHECKING, NoReturn, Optional

    import typer
    from rich.console import Console
    from rich.markup import escape

    from ._cpus import cores_phrase, parse_cpu_list
    from ._limits import (BACKENDS, LOG_FORMATS, LOG_LEVELS, MAX_BACKLOG_BYTES, MAX_BACKLOG_MSGS, MAX_BYTES_ELEMENTS,
                          MAX_CHUNK_ROWS, MAX_COUNT, MAX_HEALTH_WINDOW_S, MAX_HTTP_CONNECTIONS, MAX_HTTP_PROCESSES,
                          MAX_INLINE_COMPUTE_US, MAX_L2_POOL_SIZE, MAX_MAILBOX_SIZE, MAX_MAX_PAYLOAD_BYTES, MAX_NODE_PROCESSES, MAX_PERIOD_S,
                          MAX_TENSOR_BYTES, MAX_TIMEOUT_MS, MAX_WINDOW_US, MIN_MAX_PAYLOAD_BYTES, binary_size, interval,
                          number_as_typed)
except KeyboardInterrupt:
    raise SystemExit(128 + signal.SIGINT) from None
if TYPE_CHECKING:  # (for annotations only: the commands that use them import them)
    import asyncio

    import numpy as np


def _help_option_names_in_full() -> None:
    """Make every ``--help`` print option names in full and every help text whole, wrapped, at 60 columns and up.

    typer's rich help lays a command's options out in a table whose columns (long names, short names, ``--no-``
    names, their short names, type, help) may all wrap, and rich cuts the widest of them to fit the terminal; typer's
    settings (``rich_utils.STYLE_OPTIONS_TABLE_*``) are padding, box and lines, none for the columns. So: one space
    after each column instead of one on each side, and the help tables are made from a subclass in which

    * an option's names share one column, a comma and a space between them (typer wrote ``--help,-h``,
      ``--timeout-s,--timeout``): its short names follow its long ones (``--help, -h``, ``--input, -i``) and its
      secondary (``--no-``) names go on a line of their own below them (``--colocate`` / ``--no-colocate``). In
      columns of their own, ``-h`` made the short-name column hold something in every command's table, and the
      ``--no-`` column took 23 columns of ``up``'s: at 80 columns its help text was cut (``INFERBUS_REDIS_U…``), at
      62 to 78 cut mid-word in hundreds of places, at 60 not shown at all (a fresh-user trial);
    * every column but the last (the help text) keeps its text on one line at its full width, and the help text wraps
      in the width left, a word longer than that line folded rather than cut;
    * where the help text would have fewer than :data:`HELP_TEXT_MIN_WIDTH` columns (``up`` below 76 columns), the
      type moves into the names' column: after the (last) name where it fits within that column, else on a line of
      its own below the names.

    Every command and group of this CLI gets it (the subcommands' apps are all added to ``app`` here).
    """
    try:
        from rich.cells import cell_len
        from rich.table import Table
        from rich.text import Text
        from typer import rich_utils
    except ImportError:  # pragma: no cover (no rich: typer prints click's plain help, which wraps, not cuts)
        return
    if getattr(rich_utils, "Table", None) is not Table:  # pragma: no cover (a typer that builds its tables otherwise)
        return

    def names_of(long: Text, short: Text) -> Text:  # typer joins each kind's names with "," alone
        return Text(", ").join(name for kind in (long, short) if kind.plain for name in kind.split(","))

    def widest(cell) -> int:  # (a required option's mark is a Text, the others' a str)
        return max(cell_len(line) for line in str(cell).split("\n"))

    class HelpTable(Table):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._settings = kwargs
            self._options: list[tuple] = []  # ([required,] names, type, help) per option row

        def add_row(self, *renderables, **kwargs) -> None:
            n = len(renderables)  # typer 0.29's options row: [required,] long names, short names, --no- names,
            # their short names, type, help (the commands table's rows have 2 cells)
            if n in (6, 7) and all(isinstance(r, Text) for r in renderables[n - 6:n - 1]):
                long, short, no_long, no_short, kind = renderables[n - 6:n - 1]
                names, secondary = names_of(long, short), names_of(no_long, no_short)
                if secondary.plain:
                    names = names + Text("\n") + secondary
                renderables = (*renderables[:n - 6], names, kind, renderables[n - 1])
                self._options.append(renderables)
            super().add_row(*renderables, **kwargs)
            for column in self.columns[:-1]:
                column.no_wrap = True
            self.columns[-1].overflow = "fold"

        def __rich_console__(self, console, options):
            if not self._options or len(self._options) != len(self.rows):  # (not an options table as typer's)
                yield from super().__rich_console__(console, options)
                return
            right = self._padding[1]  # after each column but the last (pad_edge off)
            fixed = [max(widest(row[i]) for row in self._options) for i in range(len(self._options[0]) - 1)]
            if options.max_width - sum(w + right for w in fixed) >= HELP_TEXT_MIN_WIDTH or not fixed[-1]:
                yield from super().__rich_console__(console, options)
                return
            width = fixed[-2]  # the names' column
            table = Table(**self._settings)
            for row in self._options:
                *required, names, kind, help_text = row
                if kind.plain:
                    last = names.plain.split("\n")[-1]
                    fits = cell_len(last) + 1 + kind.cell_len <= width
                    names = names + Text(" " if fits else "\n") + kind
                table.add_row(*required, names, help_text)
            for column in table.columns[:-1]:
                column.no_wrap = True
            table.columns[-1].overflow = "fold"
            yield table

    rich_utils.STYLE_OPTIONS_TABLE_PADDING = (0, 1, 0, 0)
    rich_utils.Table = HelpTable


HELP_TEXT_MIN_WIDTH = 40
"""Where an options table of ``--help`` would leave its help texts fewer columns than this, an option's type goes
into the names' column (:func:`_help_option_names_in_full`)."""


def _help_width() -> Optional[int]:
    """The width ``--help`` is laid out in: None (rich's choice, the terminal's width) when stdout is a terminal;
    otherwise ``COLUMNS`` when it is set, else the width of a terminal on stdin or stderr but at least
    :data:`HELP_MIN_WIDTH`.

    rich gives piped output (``inferbus up --help | less``, a log) the width of the first of stdin, stdout and
    stderr that is a terminal, else 80: with stdin on a 40-column terminal ``up --help`` had no room left for
    the help texts at all (the option names and types took it), and at 80 columns 20 for them.
    """
    if _stdout_is_a_terminal():
        return None
    if _columns():
        return _columns()
    width = 0
    for fd in (0, 2):
        try:
            width = max(width, os.get_terminal_size(fd).columns)
        except (OSError, ValueError):  # not a terminal (or closed)
            pass
    return max(width, HELP_MIN_WIDTH)


def _err_wrap_width() -> Optional[int]:
    """The width ``up``'s reports on stderr (a supervisor's record of a child's crash, the node's own stop) are
    wrapped to, as :func:`_wrap_width` chooses it for stdout: the console's on a terminal, or where ``COLUMNS`` is
    set; None (one line each, grepped) when stderr is piped without ``COLUMNS``."""
    try:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    except ValueError:  # (closed)
        terminal = False
    if isinstance(err_console, JsonLinesConsole):
        return None
    return err_console.width if terminal or _columns() else None


def _stdout_is_a_terminal() -> bool:
    """Whether stdout is a terminal; also True where there is no stdout (started with it closed, ``>&-``: nothing
    is shown, and rich's own choice stands)."""
    return sys.stdout is None or sys.stdout.isatty()


def _columns() -> Optional[int]:
    """``COLUMNS`` where it is set to a width (a number > 0), else None."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def _output_width() -> Optional[int]:
    """The width the commands' output (``console``) is laid out in: None (rich's choice: ``COLUMNS``, else the
    terminal's width) when stdout is a terminal; piped, ``COLUMNS`` where it is set, as ``--help`` takes it
    (:func:`_help_width`), else :data:`PIPED_WIDTH`. Piped, the commands' output took 160 columns whatever
    ``COLUMNS`` said (``COLUMNS=80 inferbus models | less``: a table of 160)."""
    return None if _stdout_is_a_terminal() else _columns() or PIPED_WIDTH


PIPED_WIDTH = 160
"""The width of the commands' output piped with no ``COLUMNS`` (a log, a file): wide, so that lines stay whole."""

HELP_MIN_WIDTH = 100
"""The least width of ``--help`` printed to something other than a terminal (see :func:`_help_width`)."""


def _help_at_a_readable_width() -> None:
    """Lay every ``--help`` out in :func:`_help_width` columns (typer's ``TERMINAL_WIDTH``, when set, wins)."""
    try:
        from typer import rich_utils
    except ImportError:  # pragma: no cover (no rich: click's plain help)
        return
    if getattr(rich_utils, "MAX_WIDTH", 0) is None:
        rich_utils.MAX_WIDTH = _help_width()


class _OnImport:
    """A ``sys.meta_path`` finder that calls ``then()`` right after the module ``name`` is first imported (executed,
    before the import statement that loads it returns), once, and then leaves ``sys.meta_path``. The module itself is
    found and loaded by the other finders, as without this one.

    For typer's rich help (``typer.rich_utils``), which typer imports only when it prints help, an error box or a
    traceback: with its imports (``rich.markdown``, ``markdown_it``, ``rich.traceback``, ~35 ms) it was loaded by this
    module's import to be adjusted (:func:`_adjust_rich_help`), for every command. Now the commands that print none
    of these never load it, and every one that does finds it adjusted."""

    def __init__(self, name: str, then):
        self._name, self._then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._name:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_module_then(module) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self._then()

        spec.loader.exec_module = exec_module_then
        return spec


def _adjust_rich_help() -> None:
    """Option names in full (:func:`_help_option_names_in_full`) at a readable width (:func:`_help_at_a_readable_width`)
    and no line ending in blanks (:class:`BlankFreeConsole`) in typer's rich help: done once it is imported (at once
    if it is already, else by :class:`_OnImport`)."""
    _help_option_names_in_full()
    _help_at_a_readable_width()
    from typer import rich_utils

    if getattr(rich_utils, "Console", None) is Console:  # (typer makes its help's console of this name)
        rich_utils.Console = BlankFreeConsole


_BLANKS_AT_A_LINES_END = re.compile(r"(?:[ \t]|\x1b\[[0-9;]*m)+(?=\n)")
"""Blanks before a line's end, with the colour codes among them (kept: ``\x1b[1mname   \x1b[0m\n``)."""


class BlankFreeConsole(Console):
    """A rich :class:`~rich.console.Console` whose lines end in no blanks: it takes the blanks out before each line
    break of what it writes, the colour codes among them kept. rich wrapped a long line after a space and kept it
    (``devices``' footer: ``tensorrt: not installed (pip install `` at 60 columns), and pads the lines of a help's
    usage and description to the terminal's width (a fresh-user trial). Every command's ``console`` and
    ``err_console``, and typer's help (:func:`_adjust_rich_help`), are of this class.

    The blanks are taken out of the text rich renders for the file (``_render_buffer``, in rich 13 to 15); where a
    rich has no such method, nothing changes."""

    def _render_buffer(self, buffer) -> str:
        return _BLANKS_AT_A_LINES_END.sub(lambda m: re.sub(r"[ \t]+", "", m.group()), super()._render_buffer(buffer))


if "typer.rich_utils" in sys.modules:
    _adjust_rich_help()
else:
    sys.meta_path.insert(0, _OnImport("typer.rich_utils", _adjust_rich_help))


def _no_type_for_flags_no_braces_for_arguments() -> None:
    """Two marks of typer 0.29's help that say what is not so, for every command of this CLI: a flag's ``<bool>``
    (``--json <bool>``, ``--topology --node <bool>``, ``--help <bool>``: a flag takes no value, and ``--json true`` is
    refused), and the braces around a required argument on the usage line (``chaos run [OPTIONS] {NAME}``, read as
    a set to choose from). A flag (a count too) shows no type; a required argument shows its name alone
    (``chaos run [OPTIONS] NAME``), an optional one in brackets as before (``[VERSION]``), as Click writes them.
    Nothing changes where typer has no such methods (a typer other than the 0.29 this was written against)."""
    from typer import core

    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    type_shown = getattr(option, "display_type_rich", None)
    if type_shown is not None:
        def display_type_rich(self, ctx):
            return None if self.is_flag or self.count else type_shown(self, ctx)

        option.display_type_rich = display_type_rich
    if argument is not None and hasattr(argument, "_usage_display_name") and hasattr(argument, "display_name_raw"):
        def _usage_display_name(self) -> str:
            name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
            return name + ("..." if self.nargs != 1 else "")

        argument._usage_display_name = _usage_display_name


_no_type_for_flags_no_braces_for_arguments()


def _flag_pair_defaults_on_or_off() -> None:
    """A ``--x/--no-x`` flag's default as a user reads it: ``[default: on]`` where it is on, ``[default: off]``
    where it is off, rich help or plain, for every command of this CLI. typer 0.29 wrote the name of the flag that
    is in effect without its dashes, ``[default: no-colocate]``, ``[default: proxy]`` (a fresh-user trial: read as a
    value to pass). A pair whose default is None (``--run-to-completion``: it follows ``--colocate``, as its help
    says) shows none, a flag without a ``--no-`` twin none when off (as before), and a pair of two names
    (``--topology/--node``) its name as before. Nothing changes where typer has no such method."""
    from typer import core

    option = getattr(core, "TyperOption", None)
    default_string = getattr(option, "_get_default_string", None)
    if default_string is None:
        return

    def _get_default_string(self, *, ctx, show_default_is_str, default_value):
        if (not show_default_is_str and self.is_bool_flag and isinstance(default_value, bool) and self.secondary_opts
                and all(o.startswith("--no-") for o in self.secondary_opts)):
            return "on" if default_value else "off"
        return default_string(self, ctx=ctx, show_default_is_str=show_default_is_str, default_value=default_value)

    option._get_default_string = _get_default_string


_flag_pair_defaults_on_or_off()

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="inferbus: ML inference over NATS. A command's help: inferbus COMMAND --help (or inferbus help "
                       "COMMAND, inferbus -h COMMAND).",
                  # -h as --help: in every group and command too (each context takes its parent's names); no
                  # command has an option of its own named -h
                  context_settings={"help_option_names": ["-h", "--help"]})
console = BlankFreeConsole(width=_output_width())
err_console = BlankFreeConsole(stderr=True, soft_wrap=True)  # one line per error: greppable when piped


class JsonLinesConsole:
    """What ``up --log-format json`` prints with instead of :data:`console` and :data:`err_console`: each call of
    :meth:`print` one JSON object on one line (JSON Lines; the fields of :class:`inferbus._logs.JsonFormatter`'s
    records: ``ts``, ``level``, ``logger`` ``inferbus.up``, ``actor``, ``msg``), so that every line of ``up``'s
    stdout and stderr parses as the node's log records do. ``msg`` is the text as the console would show it, markup
    taken out (``error: up: ...``, ``note: ...``, ``inferbus up in 1.52s — NATS ...``), never wrapped.

    ``level``: of every line of stdout, ``info`` (``up``'s report of what it started, where, and its stop: written
    whatever ``--log-level``, as its text lines are); of stderr, ``error`` for a line that starts ``error:``, else
    ``warning`` (a ``note:`` or ``warning:`` about the configuration, a stop that was killed)."""

    width = 1_000_000  # (no wrapping: one record per line printed)

    def __init__(self, stderr: bool, actor: str) -> None:
        self.stderr, self.actor = stderr, actor

    def print(self, *objects, markup: bool = True, **_) -> None:
        import json
        import time

        from rich.text import Text

        from ._logs import rfc3339_utc

        parts = []
        for o in objects:
            if isinstance(o, str):
                parts.append(Text.from_markup(o).plain if markup else o)
            else:  # a renderable (the demo's table): as a console of no colours would show it, in one record
                plain = Console(width=200, no_color=True, highlight=False)
                with plain.capture() as captured:
                    plain.print(o)
                parts.append(captured.get().rstrip())
        text = " ".join(parts).strip()  # (a text line's indent too)
        level = ("error" if text.startswith("error:") else "warning") if self.stderr else "info"
        stream = sys.stderr if self.stderr else sys.stdout
        stream.write(json.dumps({"ts": rfc3339_utc(time.time()), "level": level, "logger": "inferbus.up",
                                 "actor": self.actor, "msg": text}, ensure_ascii=False) + "\n")
        stream.flush()


def _print_json_lines(ctx: typer.Context, actor: str) -> None:
    """From here to the end of ``ctx``'s command, :data:`console` and :data:`err_console` write JSON Lines
    (:class:`JsonLinesConsole`, ``actor`` its records' ``actor``)."""
    global console, err_console
    kept = console, err_console
    console, err_console = JsonLinesConsole(False, actor), JsonLinesConsole(True, actor)

    def restore() -> None:
        global console, err_console
        console, err_console = kept
    ctx.call_on_close(restore)


def _version(value: bool) -> None:
    if value:
        from ._version import __version__

        typer.echo(f"inferbus {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main_options(show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                                    help="Print the installed version and exit.")) -> None:
    """inferbus: ML inference over NATS. A command's help: inferbus COMMAND --help (or inferbus help COMMAND,
    inferbus -h COMMAND)."""


EXIT_FAILED = 1
"""Exit status: the operation ran and failed (wrong answers, not ready, refused)."""
EXIT_USAGE = 2
"""Exit status: bad usage or input, or a typed error reply (INVALID_ARGUMENT, NOT_FOUND, ...)."""
EXIT_NO_NATS = 3
"""Exit status: no NATS server of the given URL(s) accepted a connection."""
EXIT_CLOSED_OUTPUT = 128 + signal.SIGPIPE
"""Exit status (141): stdout or stderr was a pipe its reader had closed (``inferbus infer ... | head -c1``), as a
shell reports a death by SIGPIPE; see :class:`_Output`."""


class _ClosedOutput:
    """What :class:`_Output` saw: ``closed``, a write found stdout or stderr a closed pipe; ``raised``, the
    BrokenPipeError then went up to end the command; ``handler``, set by a command that takes the loss over
    (``up``: it stops its node as on a signal), called instead of raising."""

    closed = False
    raised = False
    handler = None


class _Output:
    """``sys.stdout`` or ``sys.stderr`` of the ``inferbus`` command (:func:`main` puts them in; everything else is
    the stream's own). A write or flush that finds the pipe closed (its reader gone: ``... | head -1``) sends the
    stream's file descriptor to /dev/null, so that what is still buffered, what is written later (a ``finally``'s
    output, the interpreter's last flush) and the processes started later go nowhere without an error, and records
    it in :class:`_ClosedOutput`. Then, as a Unix tool dies of SIGPIPE, it raises BrokenPipeError to end the
    command, which :func:`main` turns into exit 141 with no message; unless a ``handler`` is set (``up``), which is
    called instead, the write dropped. (Typer ended such a command with exit 1, as Click does; rich's console with
    ``SystemExit(1)`` from inside ``up``'s loop.) A write that fails otherwise (``> /dev/full``): see
    :meth:`_failed`. ``name``: ``"stdout"`` or ``"stderr"``."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def _to_devnull(self) -> None:
        """Send this stream's descriptor to /dev/null and drop what its buffer holds there."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
            self._stream.flush()
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's stream): nothing more to keep off it
            pass

    def _failed(self, exc: OSError) -> None:
        """A write failed otherwise (``> /dev/full``: ENOSPC; EIO): the descriptor goes to /dev/null as for a closed
        pipe, and the failure is recorded in :attr:`_OutputFailed.seen`, where :func:`main` finds it even when
        something on the way swallowed the exception (Click's echo tries its stream with a write of ``""`` inside
        ``except Exception``: ``chaos list > /dev/full`` ended 0, its output lost). On stdout the command ends
        (:class:`_OutputFailed`) with one line on stderr and exit 1, not rich's traceback of the OSError; on stderr,
        where nothing can be said, it goes on to its own exit status (``infer`` with NATS out of reach: 3, not 1),
        a 0 made 1 (main())."""
        self._to_devnull()
        _OutputFailed.seen.setdefault(self._name, exc)
        if self._name == "stdout":
            raise _OutputFailed(self._name, exc) from None

    def _closed(self) -> None:
        self._to_devnull()  # the text the pipe refused, and all written later, into /dev/null
        _ClosedOutput.closed = True
        if _ClosedOutput.handler is not None:
            _ClosedOutput.handler()
            return
        _ClosedOutput.raised = True
        raise BrokenPipeError(errno.EPIPE, "the reader of the command's output closed the pipe")

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)
        except OSError as exc:
            self._failed(exc)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()
        except OSError as exc:
            self._failed(exc)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _OutputFailed(Exception):
    """Writing the command's stdout failed with an OSError other than a closed pipe (``> /dev/full``): raised to end
    the command; :func:`main` prints one line on stderr and exits 1. ``seen``: the first such OSError of each stream
    (``"stdout"``, ``"stderr"``; see :meth:`_Output._failed`)."""

    seen: dict[str, OSError] = {}

    def __init__(self, name: str, exc: OSError):
        super().__init__(exc)
        self.name, self.exc = name, exc


class NatsUnreachable(Exception):
    """No NATS server of ``servers`` accepted a connection; ``str()`` names them and the last error."""

    def __init__(self, message: str, servers: list[str]):
        super().__init__(message)
        self.servers = servers


def _exit_unreachable(exc: BaseException) -> "typer.Exit":
    """Print the one "cannot reach NATS" line for ``exc`` on stderr and return the exit to raise (status 3)."""
    text = str(exc) or type(exc).__name__
    if not text.startswith("cannot reach NATS"):
        text = f"cannot reach NATS: {text}"
    head, sep, tail = text.partition(": ")
    err_console.print(f"[red]{escape(head)}[/]{sep}{escape(tail)}")
    return typer.Exit(EXIT_NO_NATS)


def _json_error(code: str, message: str, field: "str | None" = None, retry_after_ms: "int | None" = None) -> None:
    """Print a ``--json`` command's failure on stdout as the wire's error body (docs/wire.md, "Errors"):
    ``{"error": {"code": ..., "message": ..., "field"?: ..., "retry_after_ms"?: ...}}``, one line (the optional
    members only when set, as on the wire)."""
    detail = {"code": code, "message": message}
    if field is not None:
        detail["field"] = field
    if retry_after_ms is not None:
        detail["retry_after_ms"] = retry_after_ms
    print(json.dumps({"error": detail}), flush=True)


def _run(coro, as_json: bool = False):
    """Run ``coro`` on uvloop (asyncio without it); a NATS connection that fails prints one line, exit 3, and a
    typed error (e.g. INVALID_ARGUMENT for a NATS URL that is no URL) one line, exit 2 (UNAVAILABLE and
    DEADLINE_EXCEEDED: exit 1); with ``as_json`` each also
    as the wire's error object on stdout (:func:`_json_error`)."""
    import asyncio

    from nats.errors import NoServersError

    from .schemas import DeadlineExceeded, InferbusError, Unavailable

    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    try:
        return runner(coro)
    except (NatsUnreachable, NoServersError) as exc:
        if as_json:
            _json_error("UNAVAILABLE", str(exc) or type(exc).__name__)
        raise _exit_unreachable(exc) from None
    except InferbusError as err:
        if as_json:
            _json_error(err.code.value, err.message, err.field, err.retry_after_ms)
        else:
            err_console.print(f"[red]{err.code.value}[/]: {escape(err.message)}"
                              + (f" (field {err.field})" if err.field else ""))
        # UNAVAILABLE (no ingress answering, no worker) and DEADLINE_EXCEEDED (no answer in time) say the
        # deployment could not do it, not that the input was bad: exit 1, as `health` of a deployment that is down
        raise typer.Exit(EXIT_FAILED if isinstance(err, (Unavailable, DeadlineExceeded)) else EXIT_USAGE) from None


def _call(coro_fn, as_json: bool = False):
    """Run a one-shot client call (:func:`_run`): typed errors and bad files print one line + exit 2 (UNAVAILABLE
    and DEADLINE_EXCEEDED: exit 1, the deployment could not do it), unreachable NATS exit 3.

    With ``as_json`` (a command's ``--json``) a typed error is printed on stdout as the wire's error object,
    ``{"error": {"code", "message", "field"?, "retry_after_ms"?}}``, so what reads the output parses every outcome
    (unreachable NATS: code UNAVAILABLE, and the one line on stderr too); the exit statuses are the same.
    """
    return _run(coro_fn(), as_json=as_json)


def _usage(message: str) -> NoReturn:
    """A bad argument: one line on stderr, exit 2 (the usage status, as typer's own)."""
    err_console.print(f"[red]error[/]: {escape(message)}")
    raise typer.Exit(EXIT_USAGE)


OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")
"""What ``inferbus up --trace-otlp-endpoint`` needs installed (the ``otel`` extra: opentelemetry-sdk and
opentelemetry-exporter-otlp-proto-http)."""


def _check_tracing(endpoint: Optional[str], ratio: float, ratio_given: bool) -> None:
    """``up``'s tracing options, before anything starts: ``--trace-ratio`` in [0, 1] and only with
    ``--trace-otlp-endpoint``, an endpoint that is an http(s) URL, and the ``otel`` extra installed (looked up, not
    imported: ``up`` itself never imports OpenTelemetry). Exits 2 with one line (:func:`_usage`) otherwise."""
    if not 0.0 <= ratio <= 1.0:  # (NaN too)
        _usage(f"up: --trace-ratio must be in [0, 1], got {number_as_typed(ratio)}")
    if endpoint is None:
        if ratio_given:  # it would be ignored without a word
            _usage("up: --trace-ratio is the sampling of --trace-otlp-endpoint's spans and needs "
                   "--trace-otlp-endpoint; add it or leave --trace-ratio out")
        return
    from .actors._config import check_trace

    try:
        check_trace(endpoint, ratio, "up")
    except ValueError:
        _usage(f"up: --trace-otlp-endpoint must be an http:// or https:// URL (OTLP/HTTP, e.g. "
               f"http://127.0.0.1:4318/v1/traces), got {endpoint}")
    import importlib.util

    for name in OTEL_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing
            found = False
        if not found:
            _usage(f"up: --trace-otlp-endpoint needs OpenTelemetry ({name} is not installed): "
                   f"pip install -e '.[otel]' (or pip install 'inferbus[otel]')")


def _check_timeout_s(command: str, timeout_s: float, flag: str = "--timeout-s") -> None:
    """A client command's ``--timeout-s`` (one request's budget, seconds, retries included), as the SDK checks
    ``timeout_s``: a finite number > 0, before connecting; and at most the servers' own ceiling of a budget
    (``MAX_TIMEOUT_MS``, 600 s): a longer one bounds nothing on the server, and against a prefix nobody serves
    ``health --timeout-s 1e300`` retried for ever (a fresh-user trial). Every command's budget goes through it
    (``chaos run``'s per-request one too, with ``command`` ``chaos run`` and ``flag`` the option's
    name as typed, ``--timeout`` being its older one), so each says the range in the same words.

    Raises:
        typer.Exit: (status 2) one line, ``<command>: <flag> must be in (0, 600] seconds, got ...`` (both ends,
            whichever was passed), the value as given (Python's shortest exact form, ``600.0001``, ``1e+300``:
            ``:g`` said ``got 600`` of 600.0001; and ``601``, ``0``, not ``601.0``, ``0.0``: see
            :func:`inferbus._limits.number_as_typed`).
    """
    if not 0 < timeout_s <= MAX_TIMEOUT_MS / 1000.0:  # NaN fails the comparison
        _usage(f"{command}: {flag} must be in {_TIMEOUT_S_RANGE} seconds, "
               f"got {number_as_typed(timeout_s)}")


_TIMEOUT_S_RANGE = interval(0, MAX_TIMEOUT_MS / 1000.0, lo_open=True)
"""The range of every client command's ``--timeout-s``, as its help and its refusal (:func:`_check_timeout_s`) name
it: ``(0, 600]`` (seconds)."""


def _timeout_s_as_typed() -> str:
    """``--timeout`` when the command line gave the budget by that older name (``chaos run``'s and the ``models``
    writes' ``--timeout-s`` keep it), else ``--timeout-s``: Click does not say which name of an option was used, and a
    refusal names the option as typed."""
    return "--timeout" if any(a.split("=", 1)[0] == "--timeout" for a in sys.argv[1:]) else "--timeout-s"


_FIELD_PARAMS = {"nats_max_payload_bytes": "nats_max_payload", "fault_control": "fault_injection",
                 "rate_limit_per_s": "rate_limit", "client_rate_limit_per_s": "client_rate_limit",
                 "hedge_budget_ratio": "hedge_budget", "models_dir": "models"}
"""Configuration fields whose ``inferbus up`` option has another name (the rest: the field's name with dashes)."""

_FIELD = re.compile(r"\b(?:[A-Z]\w*Config(?:\.\w+)*\.)?([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b|\b[A-Z]\w*Config(?:\.(\w+))")


def _with_flags(message: str, command) -> str:
    """A configuration check's message (``NodeConfig.ingress_options.rate_limit_per_s must be ...``) in the
    terms of ``command`` (a typer command function): each field that is one of its options becomes the option's
    name (``--rate-limit must be ...``) and a leading ``XConfig:`` goes; fields with no option stay as they are."""
    import inspect

    flags = {}
    for name, param in inspect.signature(command).parameters.items():
        decls = getattr(param.default, "param_decls", None)
        if decls is None:  # an argument, not an option
            continue
        longs = [d for decl in decls for d in decl.split("/") if d.startswith("--")]
        flags[name] = longs[0] if longs else "--" + name.replace("_", "-")

    def sub(m: re.Match) -> str:
        field = m.group(1) or m.group(2)
        return flags.get(_FIELD_PARAMS.get(field, field)) or m.group(0)

    # the values the message quotes or reports (``'a_b'``, ``got ...``) are the user's own text: left as they are,
    # but for the ``.0`` of a float with no fraction (``--hedge-budget 2``: ``got 2``, not ``got 2.0``), as
    # number_as_typed writes a value
    message = re.sub(r"(, got -?\d+)\.0(?!\d)", r"\1", message)  # (`, got -1.0`: --busy-poll-us, --rate-limit)
    head, got, tail = message.partition(", got ")
    parts = re.split(r"('[^']*'|\"[^\"]*\")", head)
    head = "".join(p if i % 2 else _FIELD.sub(sub, p) for i, p in enumerate(parts))
    return re.sub(r"^[A-Z]\w*Config: ", "", head + got + tail)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option of parameter ``name`` was given (on the command line or by its environment variable),
    not left at its default: what tells an option that cannot apply from one left alone."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


_UP_SECURITY_FLAGS = {"nkey_seed": "--nats-nkey-seed", "creds": "--nats-creds", "tls_ca": "--tls-ca",
                      "tls_cert": "--tls-cert", "tls_key": "--tls-key"}
"""``up``'s options for the files :func:`_check_security_files` checks."""


def _check_security_files(nkey_seed: Optional[Path], creds: Optional[Path], tls_ca: Optional[Path],
                          tls_cert: Optional[Path], tls_key: Optional[Path], *, command: str = "up",
                          names: dict[str, str] = _UP_SECURITY_FLAGS) -> None:
    """Credential and TLS files, before anything starts: each given one a readable file, the nkeys package there
    for an NKey seed or ``.creds``, the certificate and key loadable (Python's ``ssl``), else one line and exit 2.
    (A missing file was a traceback after the embedded nats-server had started.) ``command`` starts the line
    ("" for none); ``names`` says how each file was given (``up``'s options, or the client commands' environment
    variables, :data:`CLIENT_ENV`)."""
    who = f"{command}: " if command else ""
    if tls_key is not None and tls_cert is None:
        _usage(f"{who}{names['tls_key']} is the key of {names['tls_cert']}; give the certificate too")
    for name, path in (("nkey_seed", nkey_seed), ("creds", creds), ("tls_ca", tls_ca), ("tls_cert", tls_cert),
                       ("tls_key", tls_key)):
        if path is None:
            continue
        if not path.is_file():
            _usage(f"{who}{names[name]} {path}: {'is a folder' if path.is_dir() else 'no such file'}")
        if not os.access(path, os.R_OK):
            _usage(f"{who}{names[name]} {path}: not readable")
    if nkey_seed is not None or creds is not None:
        import importlib.util

        if importlib.util.find_spec("nkeys") is None:
            _usage(f"{who}{names['creds'] if creds else names['nkey_seed']} needs the nkeys package: "
                   f"pip install 'inferbus[nkeys]'")
        if nkey_seed is not None:
            import nkeys

            try:
                nkeys.from_seed(nkey_seed.read_bytes().strip())
            except Exception as exc:  # nkeys raises its own error types (and binascii's) for a bad seed
                _usage(f"{who}{names['nkey_seed']} {nkey_seed}: not an NKey seed ({type(exc).__name__})")
        if creds is not None and b"NKEY SEED" not in creds.read_bytes():
            _usage(f"{who}{names['creds']} {creds}: not a .creds file (a user JWT and its NKey seed, as `nsc` writes "
                   f"them)")
    if tls_ca is not None or tls_cert is not None:
        import ssl

        try:
            ctx = ssl.create_default_context(cafile=str(tls_ca) if tls_ca else None)
        except (ssl.SSLError, OSError, ValueError) as exc:
            _usage(f"{who}{names['tls_ca']} {tls_ca}: not a CA certificate bundle (PEM): {exc}")
        if tls_cert is not None:
            try:
                ctx.load_cert_chain(str(tls_cert), str(tls_key) if tls_key else None)
            except (ssl.SSLError, OSError, ValueError) as exc:
                given = f"{names['tls_cert']} {tls_cert}" + (f" with {names['tls_key']} {tls_key}" if tls_key else "")
                _usage(f"{who}{given}: not a certificate and its private key (PEM; the key in the certificate's file "
                       f"or in {names['tls_key']}): {exc}")


def _nats_urls_given(command: str, nats_url: str, option: str = "--nats-url") -> list[str]:
    """The servers of a ``--nats-url`` given (comma-separated, empty entries dropped), each URL's form checked
    (scheme, host, port 1-65535), before any connect; one that names none (``''``, ``','``: an unset variable in a
    script) or a URL of another form (``http://...``) is one line, exit 2. (``infer``, ``health``, ``models``,
    ``bench`` sent it to the SDK and printed its ``INVALID_ARGUMENT: Client.connect: ...`` reply, without the
    ``error: COMMAND:`` every other usage error has: a fresh-user trial; ``models load`` and ``region`` took the
    default URL instead; ``region manager`` ended in a traceback.)

    Raises:
        typer.Exit: (2) ``error: COMMAND: OPTION '' names no server; give nats://HOST:PORT[,nats://HOST:PORT...]``,
            or ``error: COMMAND: OPTION 'http://...': expected nats://HOST:PORT ...``.
    """
    from .bus import server_url_problem, split_servers

    urls = list(split_servers(nats_url))
    if not urls:
        _usage(f"{command}: {option} {nats_url!r} names no server; give nats://HOST:PORT[,nats://HOST:PORT...]")
    for u in urls:
        problem = server_url_problem(u)
        if problem is not None:
            _usage(f"{command}: {option} {problem}")
    return urls


def _check_nats_urls(nats_url: str) -> str:
    """``up``'s ``--nats-url`` with empty entries dropped and each URL checked (:func:`_nats_urls_given`): the same
    string joined by commas (nats-py would raise mid-start)."""
    return ",".join(_nats_urls_given("up", nats_url))


def _check_accelerator_env() -> None:
    """The workers' accelerator environment variables, checked before anything starts (one line, exit 2,
    instead of every worker failing its start with a traceback)."""
    from .accelerators._cuda import SCHEDULES
    from .accelerators._jax import TRANSFERS

    for name, allowed in (("INFERBUS_JAX_TRANSFER", ("auto",) + TRANSFERS), ("INFERBUS_CUDA_SCHEDULE", tuple(SCHEDULES))):
        value = os.environ.get(name)
        if value is not None and value not in allowed:
            _usage(f"up: environment variable {name} must be one of {', '.join(allowed)} (or unset), got {value!r}")


def _check_output_file(option: str, path: Path) -> None:
    """``path`` can be written as a file, checked before anything starts (one line, exit 2, naming ``option``;
    :func:`inferbus._paths.output_file_problem`). (``up --demo --json`` used to run the whole demo and then end in
    a FileNotFoundError / IsADirectoryError traceback.)"""
    from ._paths import output_file_problem

    problem = output_file_problem(path, "demo.json")
    if problem is not None:
        _usage(f"up: {option} {path}: {problem}")


def _folder_option(command: str, option: str, value: Optional[str]) -> Optional[Path]:
    """A folder option taken as text (a ``str`` option, not a ``Path`` one): ``""`` or a blank value is refused, one
    line, exit 2; else its Path (None for None). ``Path('')`` is ``Path('.')``: an empty ``--out``, ``--data-root``,
    ``--run-dir`` or ``--models`` (an unset variable in a script) was the current folder without a word; ``.`` says
    that on purpose.

    Raises:
        typer.Exit: (2) ``error: COMMAND: OPTION must name a folder, got '' (give '.' for the current one)`` (the
            value as given: ``'  '`` for a blank one).
    """
    if value is None:
        return None
    if not value.strip():
        _usage(f"{command}: {option} must name a folder, got {value!r} (give '.' for the current one)")
    return Path(value)


def _check_run_dir(path: Path, command: str = "up") -> list[Path]:
    """``up --run-dir`` (``cluster up --run-dir``): a folder that exists and is writable, or one that can be made (its
    parents made too), checked before anything starts (one line, exit 2; :func:`inferbus._paths.folder_problem`). It
    used to end in a FileExistsError / PermissionError traceback from the node (from the topology's start) once the
    option checks had passed.

    Returns:
        The folders this check made, the deepest first (``[]`` when ``path`` existed): what
        :func:`_remove_made_folders` takes away again when the command ends on a usage error before it starts.

    Raises:
        typer.Exit: (2) one line ``error: COMMAND: --run-dir PATH: <why>``.
    """
    from ._paths import folder_problem

    path = Path(path)
    missing = []
    for folder in (path, *path.parents):  # the folders folder_problem would make: path and its missing parents
        if os.path.lexists(folder):
            break
        missing.append(folder)
    problem = folder_problem(path)
    if problem is not None:
        _remove_made_folders(missing)  # (parents made before the deepest could not be)
        _usage(f"{command}: --run-dir {path}: {problem}")
    return missing


def _remove_made_folders(made: list[Path]) -> None:
    """Remove the folders :func:`_check_run_dir` made (``made``, deepest first), each only while it is empty: an ``up``
    that ended on a usage error after that check (``--nats-port`` taken) left an empty ``--run-dir`` behind. A folder
    that existed before, or that has anything in it now, is kept; never raises."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone, or not ours to remove): it and its parents stay
            return


def _check_models_repo(command: str, models_dir: str):
    """``--models``: a folder whose models can all be read, checked before anything starts; returns its
    :class:`~inferbus.actors.ModelRepository`.

    Raises:
        typer.Exit: (2) one line, ``error: COMMAND: the model repository PATH is not a folder (--models)`` or
            ``... cannot be served: <why>`` (an unreadable artifact): not every actor's crash after the servers
            started (``cluster up --models /nonexist`` printed 255 lines of nested start errors, exit 1).
    """
    if not Path(models_dir).is_dir():
        _usage(f"{command}: the model repository {models_dir} is not a folder (--models)")
    from .actors._repository import ModelRepository, RepositoryError

    try:  # read every model's metadata now: an unreadable artifact is one line here, not every actor's crash
        return ModelRepository(Path(models_dir))
    except RepositoryError as exc:
        _usage(f"{command}: the model repository cannot be served: {' '.join(str(exc).split())}")


def _note_if_no_models(models_dir: str, repo) -> None:
    """A note on stderr per folder of ``models_dir`` that looks like a model but is not one (:attr:`ModelRepository.skipped`),
    per ``config.json`` ``input``/``output`` entry that contradicts its ``model.onnx``
    (:func:`~inferbus.actors._repository.config_tensor_mismatches`), and one when the repository ``repo`` (read from
    ``models_dir``) holds no model: served all the same
    (nothing to refuse), every request NOT_FOUND. ``up`` and ``cluster up`` print it alike."""
    for name, why in repo.skipped.items():  # a folder that looks like a model but has no config.json: not served
        err_console.print(f"[yellow]note[/]: {escape(str(Path(models_dir) / name))} {escape(why)}: not served "
                          f"(docs/models.md: the repository layout)")
    if not len(repo):
        err_console.print(f"[yellow]note[/]: no models in {escape(models_dir)} (no <model>/config.json): "
                          f"every request will be NOT_FOUND (docs/models.md: the repository layout)")
    from .actors._repository import config_tensor_mismatches

    for model in repo:  # config.json's input/output are not read: one that contradicts model.onnx only misleads
        for line in config_tensor_mismatches(model):
            err_console.print(f"[yellow]note[/]: model {escape(model.name)}: {escape(line)} (docs/models.md: keys "
                              f"not read)")


_BACKEND_PACKAGES = {"jax": ("jax", "pip install 'inferbus[jax]'"),
                     "tensorrt": ("tensorrt", "pip install tensorrt; it serves NVIDIA GPUs only")}
"""Backends whose runtime is an optional package: its import name and how to install it."""


def _check_backends_installed(names: tuple[str, ...]) -> None:
    """Each backend's runtime package can be found (``importlib.util.find_spec``, no import), checked before
    anything starts: one line naming it, exit 2. Whether it imports and has a device is known only from the
    device probe, after the servers started; :func:`_up` turns that failure into one line too."""
    from importlib.util import find_spec

    for name in names:
        if name not in _BACKEND_PACKAGES:
            continue
        module, install = _BACKEND_PACKAGES[name]
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install, or a module object without a spec
            found = False
        if not found:
            _usage(f"up: --backends {name}: backend {name}: not installed ({install})")


def _check_prefix(prefix: str) -> None:
    """``--prefix`` as the bus takes it (:func:`inferbus.bus._config.prefix_problem`: dot-separated tokens of
    letters, digits, '_' or '-', none after the first one inferbus puts after a prefix), else one line and exit 2 (it
    used to end in a traceback from the connection's config)."""
    from typer.main import get_current_context

    from .bus._config import prefix_problem

    problem = prefix_problem(prefix)
    if problem is not None:
        names = []  # the command as typed below the program (``models``, ``region status``), however it was run
        ctx = get_current_context(silent=True)
        while ctx is not None and ctx.parent is not None:
            names.append(ctx.info_name)
            ctx = ctx.parent
        command = " ".join(reversed(names))
        _usage((f"{command}: " if command else "") + f"--prefix {problem}")


from ._client_env import CLIENT_ENV  # noqa: E402 (the client commands' credentials: their docstring)


def _check_client_env(given: dict[str, str]) -> None:
    """The client commands' credentials from the environment (``given``: :data:`CLIENT_ENV` field → value), before
    connecting, as ``up`` checks its options: the files (:func:`_check_security_files`, naming the variable) and a
    user with its password. A missing file was a traceback (the nkeys import) or "cannot reach NATS" naming
    neither the file nor the variable, and a user without a password was sent as given (a fresh-user trial).

    Raises:
        typer.Exit: (status 2) one line naming the variable.
    """
    if ("user" in given) != ("password" in given):
        have, lacks = (("user", "password") if "user" in given else ("password", "user"))
        _usage(f"{CLIENT_ENV[have]} needs {CLIENT_ENV[lacks]} (NATS takes a user with its password)")
    paths = {k: Path(given[f]) if f in given else None
             for k, f in (("nkey_seed", "nkeys_seed"), ("creds", "user_credentials"), ("tls_ca", "tls_ca_file"),
                          ("tls_cert", "tls_cert_file"), ("tls_key", "tls_key_file"))}
    if any(v is not None for v in paths.values()):
        _check_security_files(**paths, command="", names=_CLIENT_ENV_NAMES)


_CLIENT_ENV_NAMES = {"nkey_seed": CLIENT_ENV["nkeys_seed"], "creds": CLIENT_ENV["user_credentials"],
                     "tls_ca": CLIENT_ENV["tls_ca_file"], "tls_cert": CLIENT_ENV["tls_cert_file"],
                     "tls_key": CLIENT_ENV["tls_key_file"]}


_CONNECT_TIMEOUT_S = 2.0
"""A CLI command's connect: one try per server, each given at most this long (seconds) for the socket, the server's
INFO and the handshake (nats-py's ``connect_timeout``), and no more than the command's ``--timeout-s``."""


async def _one_shot_client(nats_url: "str | list[str]", prefix: str, *, timeout_s: "float | None" = None,
                           **bus_options):
    """A client for one CLI command: one connect attempt per server (no reconnect rounds), each of at most
    :data:`_CONNECT_TIMEOUT_S`; credentials and TLS files from the environment (:data:`CLIENT_ENV`) unless given.

    Args:
        timeout_s: the command's budget (its ``--timeout-s``, seconds, > 0): the connect, every server's try
            together, ends within it, each try within ``min(2 s, timeout_s)``; the caller gives what is left of it
            to the request (:func:`_left_s`). None (default): 2 s per server, however many servers. (nats-py's own
            timeouts made the connect alone 2 s per server whatever the budget: ``health --timeout-s 1`` against
            three servers that accept TCP and never speak NATS took 7.3 s.)

    Raises:
        NatsUnreachable: no server of ``nats_url`` (comma-separated) accepted the connection (in time); the message
            names the URLs and the cause, e.g. ``cannot reach NATS at nats://h:4222: not connected within the
            command's --timeout-s (1 s)``.
        typer.Exit: (status 2) ``prefix`` is not a valid subject prefix, one line printed.
    """
    import asyncio

    from .client import Client
    from .schemas import Unavailable

    from .bus import shown_servers, split_servers

    _check_prefix(prefix)
    servers = list(split_servers(nats_url))
    from_env = {}
    for field_name, var in CLIENT_ENV.items():
        if os.environ.get(var) and field_name not in bus_options:
            bus_options[field_name] = from_env[field_name] = os.environ[var]
    _check_client_env(from_env)
    try_s = _CONNECT_TIMEOUT_S if timeout_s is None else min(_CONNECT_TIMEOUT_S, timeout_s)
    in_budget = f"not connected within the command's --timeout-s ({timeout_s:g} s)" if timeout_s is not None else ""
    if timeout_s is not None and timeout_s < _SHORT_CONNECT_BUDGET_S:  # (a trial read 0.001 s as "NATS down")
        in_budget += (f"; a connect takes a few ms or more, so with a --timeout-s under "
                      f"{_SHORT_CONNECT_BUDGET_S:g} s the budget may be what ran out, not the server")
    connecting = Client.connect(servers, prefix, connect_attempts=1, connect_timeout_s=try_s, **bus_options)
    try:
        if timeout_s is None:
            return await connecting
        return await asyncio.wait_for(connecting, timeout_s)
    except asyncio.TimeoutError:  # the tries of several servers (or nats-py's waits) passed the budget
        raise NatsUnreachable(f"cannot reach NATS at {shown_servers(servers)}: {in_budget}", servers) from None
    except Unavailable as err:
        # nats-py's bare "TimeoutError" (the one cause, or one server's among several): say what timed out, and
        # after what
        timed_out = (in_budget if timeout_s is not None and try_s >= timeout_s else
                     f"not connected within {try_s:g} s{' per server' if len(servers) > 1 else ''} (TimeoutError)")
        message = re.sub(r"(?<=: )(?:not connected within \S+ s \((?:TimeoutError)\)|TimeoutError)(?=;|$)",
                         lambda _: timed_out, err.message)
        raise NatsUnreachable(message, servers) from err


_SHORT_CONNECT_BUDGET_S = 0.1
"""A command's ``--timeout-s`` under which a connect that did not finish in time is said to be perhaps the budget's
doing (a TCP and NATS handshake with a server: ~1-20 ms; a TLS one more)."""


def _left_s(t_end: float) -> float:
    """Seconds left of a command's budget that ends at ``t_end`` (``time.monotonic()``), at least 1 ms: what a
    request is given after its connect (:func:`_one_shot_client`) took its share."""
    import time

    return max(t_end - time.monotonic(), 0.001)


def _port_busy(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


_PROBE_TIMEOUT_S = 0.5
"""How long :func:`_listener_kind` waits for a server's first bytes, and then for the answer to a TLS ClientHello (s
each); a NATS server sends its INFO at once, a TLS server answers a ClientHello at once."""


def _listener_kind(port: int, timeout_s: float = _PROBE_TIMEOUT_S) -> str:
    """What listens on 127.0.0.1:``port``, probed: ``"nats"`` when it sends ``INFO {...}`` as soon as a client
    connects (the NATS client protocol); ``"tls"`` when it sends nothing within ``timeout_s`` (or closes) and then,
    on a second connection, completes a TLS handshake begun with a ClientHello, or answers it with a TLS alert (no
    certificate is verified, nothing is sent past the handshake): a NATS server configured TLS first
    (``handshake_first``) waits for the client's hello and sent nothing, so it read as "another program"; else
    ``"other"`` (other bytes, a reply that is no TLS, silence to both, a refused or reset connection). Never
    raises."""
    import socket
    import ssl

    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            while len(got) < 6:
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
    except TimeoutError:  # (socket.timeout) silent past timeout_s: perhaps waiting for a TLS client's hello
        pass
    except OSError:  # refused, reset
        return "other"
    if got.startswith(b"INFO ") or got.startswith(b"INFO\t"):
        return "nats"
    if got:
        return "other"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as raw:
            raw.settimeout(timeout_s)
            with ctx.wrap_socket(raw, do_handshake_on_connect=False) as tls:
                tls.do_handshake()
        return "tls"
    except ssl.SSLError as exc:  # an alert is a TLS server's answer (e.g. no protocol version in common)
        return "tls" if "ALERT" in (exc.reason or "").upper() else "other"
    except OSError:  # refused, reset, closed, silent past timeout_s
        return "other"


def _port_taken(port: int, since: str = "") -> str:
    """``up``'s one line for an embedded NATS port that is taken (``since``: e.g. `` (taken while this node
    started)``), saying what holds it as probed (:func:`_listener_kind`): it said "the NATS already listening
    there" of any program's socket, and "another program" of a NATS server configured TLS first. A TLS server gets
    the advice of another program's port: ``up`` cannot join a NATS server that wants TLS before its INFO."""
    kind = _listener_kind(port)
    if kind == "nats":
        return (f"up: port {port} is in use{since} by a NATS server: pass --nats-port 0 (any free port), another "
                f"--nats-port, or --nats-url nats://127.0.0.1:{port} to use that server")
    if kind == "tls":
        return (f"up: port {port} is in use{since} by a TLS server (perhaps NATS with TLS first): pass --nats-port 0 "
                f"(any free port) or another --nats-port")
    return (f"up: port {port} is in use{since} by another program (not a NATS server): pass --nats-port 0 (any free "
            f"port) or another --nats-port")


def _cannot_listen(host: str, port: int) -> str | None:
    """None when a TCP server could listen on ``host:port`` now (bound and released at once, with SO_REUSEADDR as
    the metrics server binds), else why not (the OS's words)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _models_dir(models: Optional[Path]) -> str:
    from .actors import default_models_dir

    return str((models or default_models_dir()).resolve())


_REL = "Reliability"
MAX_DEMO_DURATION_S = 3600.0
"""Longest ``--demo-duration`` (s): an hour of every demo step is a typo, not a demo."""
_SEC = "Security"


@app.command(short_help="Serve models: NATS, Valkey, ingress, workers, aggregator.")
def up(
    ctx: typer.Context,
    models: Optional[str] = typer.Option(None, help="Model repository folder (default ./models).", metavar="<path>"),
    model: Optional[list[str]] = typer.Option(None, "--model", metavar="<name>", help="Serve only this model of the repository "
                                              "(repeat for several; default: every model in it). The set is fixed "
                                              "for the node's life: `models load` of another model is NOT_FOUND."),
    workers: int = typer.Option(0, help=f"CPU worker processes (0 = one per core, not counting --nats-cpus), in "
                                f"{interval(0, MAX_NODE_PROCESSES)}."),
    ingress: int = typer.Option(1, help=f"Ingress replicas (one queue group), in {interval(1, MAX_NODE_PROCESSES)}."),
    colocate: bool = typer.Option(False, help="Run each CPU worker slot in one process with an ingress replica, "
                                  "which hands it requests in-process (no forward hop); --ingress is then refused "
                                  "(the CPU slots are the ingress replicas)."),
    run_to_completion: Optional[bool] = typer.Option(
        None, "--run-to-completion/--no-run-to-completion", show_default=False,
        help="Needs --colocate, where it is on by default: a miss with nothing to batch with is computed and "
        "answered in the call that received it (no queue, no task switch), and misses that arrive together are "
        "held back until the last and computed as batches in one call; off: always through the worker's queue."),
    nats_port: int = typer.Option(4222, help=f"Port of the embedded nats-server (0 = any free port), in {interval(0, 65535)}."),
    nats_url: Optional[str] = typer.Option(None, help="Use this NATS (comma-separated URLs) instead of the embedded one."),
    spread_servers: bool = typer.Option(False, help="With several --nats-url servers: process k connects to server k "
                                        "mod n first (others for failover); with gateway-joined servers and --colocate "
                                        "a request stays on its server."),
    redis_url: Optional[str] = typer.Option(None, envvar="INFERBUS_REDIS_URL", help="Use this Redis/Valkey for the L2 cache instead of the embedded Valkey; a password goes in the URL, percent-encoded (prefer the env var: argv is public)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Run without the L2 cache (no Valkey). Each ingress's "
                                  "in-process L1 cache stays on: a model's cache_ttl_ms 0 (config.json) turns "
                                  "result caching off for that model."),
    l2_lookup: bool = typer.Option(False, help="Look up the L2 cache on every L1 miss (one Redis round trip)."),
    prefix: str = typer.Option("inferbus", help="Subject prefix: dot-separated tokens of letters, digits, '_' or "
                               "'-', at most 128 characters."),
    node_id: str = typer.Option("n1", help="This node's name, the prefix of its process ids (n1-w0, n1-i0...): "
                                "give each node that joins one NATS (--nats-url) its own."),
    region: str = typer.Option("", help="This node's region (letters, digits, '-', '_'): every ingress prefers "
                               "workers of its own region and sends to another region's only when none here can take "
                               "it, and answers name it (their region parameter). Nodes of several regions on one NATS "
                               "supercluster each give theirs (docs/regions.md); default: none."),
    pin_cpus: bool = typer.Option(False, help="Pin each process to one core (round robin over the cores not in "
                                  "--nats-cpus)."),
    nats_cpus: Optional[str] = typer.Option(None, help="Run the embedded nats-server on these cores, e.g. 12-15 "
                                            "(a CPU list as taskset -c takes it), and count only the other cores for "
                                            "--workers 0; with --pin-cpus the actors are pinned to the other cores, "
                                            "which keeps nats-server's threads off the serving cores."),
    busy_poll_us: float = typer.Option(0.0, help="Busy polling: each worker/ingress process keeps polling "
                                       "this many µs after each request instead of sleeping (lower latency, a full "
                                       "core per busy process; give each process a core, e.g. --colocate "
                                       f"--pin-cpus). 0 = off; in {interval(0, MAX_WINDOW_US)} µs."),
    backends: str = typer.Option("onnxruntime", help=f"Comma-separated backends, at least one of {', '.join(BACKENDS)}: "
                                 "one worker per device each serves; see `inferbus devices`."),
    precision: str = typer.Option("auto", help="auto (fp16 on GPU/TPU, fp32 on CPU), fp32, fp16, bf16 or int8; "
                                  "checked per model against FP32, falling back to fp32."),
    run_dir: Optional[str] = typer.Option(None, help="Logs and server data (default: a temp folder).",
                                          metavar="<path>"),
    log_level: str = typer.Option("info", metavar="<level>", help=f"{', '.join(LOG_LEVELS)}: the least severity "
                                  "of the records the node (node.log) and each actor process (<actor>.log in the "
                                  "run dir) write; up's stderr shows warning and above (or this, if higher)."),
    log_format: str = typer.Option("text", metavar="<format>", help="text, or json: one JSON object per line (ts, "
                                   "level, logger, actor, msg, exc) in node.log, the actors' logs and the node's "
                                   "records on stderr."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", "--http-port",
                                               help="Serve this node's HTTP on this port: Prometheus metrics (path "
                                               "/metrics) and the OIP v2 REST API (KServe/Triton): health "
                                               "/v2/health/live, /v2/health/ready, /v2/models/<name>/ready; metadata "
                                               "/v2, /v2/models/<name>; POST /v2/models/<name>/infer; statistics "
                                               "/v2/models/stats, /v2/models/<name>/stats; POST /v2/repository/index, "
                                               "POST .../models/<name>/load and .../unload under "
                                               "/v2/repository/; the model paths per version too; address "
                                               "--metrics-host (0 = any free port; default "
                                               f"off), in {interval(0, 65535)} (docs/http.md)."),
    http_infer: bool = typer.Option(False, "--http-infer/--no-http-infer",
                                    help="Answer POST /v2/models/<name>/infer on the HTTP port (needs "
                                    "--metrics-port; off: 403). The port has no authentication: whoever reaches it "
                                    "runs the models without NATS credentials (docs/http.md)."),
    http_model_control: bool = typer.Option(False, "--http-model-control/--no-http-model-control",
                                            help="Serve model load and unload on the HTTP port: Triton's model "
                                            "repository extension, POST .../models/<name>/load and .../unload under "
                                            "/v2/repository/, as its explicit model control mode (needs "
                                            "--metrics-port; off: 403). They "
                                            "change what every node on the NATS serves, and the port has no "
                                            "authentication (docs/http.md)."),
    http_idle_timeout_s: float = typer.Option(30.0, help="Seconds the HTTP port keeps a connection without a "
                                              "byte in or out before it closes it (a kept-alive one between requests; "
                                              "a half-sent body is answered 408), in "
                                              f"{interval(0, 3600, lo_open=True)}; needs --metrics-port."),
    http_max_connections: int = typer.Option(100, help="Open connections at most on the HTTP port, and threads "
                                             "running their requests, in "
                                             f"{interval(1, MAX_HTTP_CONNECTIONS)}: past it the next connections wait "
                                             "in the kernel's listen backlog until one closes (keep-alive connections "
                                             "stay open until --http-idle-timeout-s); needs --metrics-port."),
    http_processes: int = typer.Option(0, help="Serve the HTTP port from this many processes of their own, in "
                                       f"{interval(0, MAX_HTTP_PROCESSES)}: each listens on it (SO_REUSEPORT) and "
                                       "runs the inferences over HTTP on its own NATS connection, the rest forwarded "
                                       "to the node; 0: the node process serves it (about 2k inferences/s at most). "
                                       "--http-max-connections is per process; needs --metrics-port."),
    metrics_host: str = typer.Option("0.0.0.0", "--metrics-host", "--http-host",
                                     help="Address of the HTTP endpoint (0.0.0.0: every interface; 127.0.0.1: this "
                                     "host only); needs --metrics-port."),
    trace_otlp_endpoint: Optional[str] = typer.Option(None, help="OpenTelemetry tracing: export spans of sampled "
                                                      "requests over OTLP/HTTP to this URL (a collector's, its path "
                                                      "usually /v1/traces; default off; needs the otel extra: "
                                                      "pip install -e '.\\[otel]').", metavar="<url>"),
    trace_ratio: float = typer.Option(1.0, help=f"With --trace-otlp-endpoint: the probability, in {interval(0, 1)}, "
                                      "that a request without a traceparent is traced; one with a traceparent "
                                      "follows its sampled flag."),
    demo: bool = typer.Option(False, help="Run a short checked load run, print the table and exit."),
    demo_duration: float = typer.Option(3.0, help=f"Seconds per demo load step, in "
                                        f"{interval(0, MAX_DEMO_DURATION_S, lo_open=True)}."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="With --demo: also write the results as JSON to "
                                            "this file (its folder must exist and be writable)."),
    # reliability (docs/failure-semantics.md)
    health_timeout_s: float = typer.Option(5.0, help="A worker silent this long is taken out of routing (s, in "
                                           f"{interval(0.5, 86400)}: workers report every 100 ms).", rich_help_panel=_REL),
    forget_after_s: Optional[float] = typer.Option(None, help="A worker silent this long is forgotten: dropped from the "
                                                   "routers and health until it reports again (s, in "
                                                   f"(--health-timeout-s, {MAX_PERIOD_S}], or inf: never; default "
                                                   "max(60, 12 x --health-timeout-s)).", rich_help_panel=_REL),
    max_error_rate: float = typer.Option(0.01, help=f"A worker over this error rate (its own failures) is unhealthy, in {interval(0, 1)}.", rich_help_panel=_REL),
    min_window_requests: int = typer.Option(100, help=f"Requests in a worker's window before its error rate is judged, in {interval(1, MAX_COUNT)}.", rich_help_panel=_REL),
    health_window_s: float = typer.Option(10.0, help=f"Sliding window of the workers' error rate (s), in {interval(1, MAX_HEALTH_WINDOW_S)}.", rich_help_panel=_REL),
    breaker_failures: int = typer.Option(5, help=f"Consecutive failures that open a worker's circuit breaker, in {interval(1, MAX_COUNT)}.", rich_help_panel=_REL),
    breaker_open_s: float = typer.Option(30.0, help=f"Seconds a breaker stays open before one probe (half-open), in {interval(0, MAX_PERIOD_S, lo_open=True)}.", rich_help_panel=_REL),
    rate_limit: float = typer.Option(0.0, help=f"Requests/s this node admits (token bucket; 0 = off), in {interval(0, MAX_COUNT)}.", rich_help_panel=_REL),
    rate_burst: float = typer.Option(0.0, help="Bucket capacity (requests) above the rate: R req/s for T s needs (R - rate) * T; "
                                     f"0 (one second of the rate) or in {interval(1, MAX_COUNT)}, with --rate-limit set.", rich_help_panel=_REL),
    client_rate_limit: float = typer.Option(0.0, help=f"Requests/s per Inferbus-Client-Id (0 = off), in {interval(0, MAX_COUNT)}.", rich_help_panel=_REL),
    client_rate_burst: float = typer.Option(0.0, help="Per-client bucket capacity (requests): 0 (one second of the rate) or in "
                                            f"{interval(1, MAX_COUNT)}, with --client-rate-limit set.", rich_help_panel=_REL),
    hedge_budget: float = typer.Option(0.1, help=f"Hedged copies allowed per request, in {interval(0, 1)}.", rich_help_panel=_REL),
    mailbox_size: int = typer.Option(1024, help=f"Worker mailbox bound; beyond it requests are shed. In {interval(1, MAX_MAILBOX_SIZE)} requests.", rich_help_panel=_REL),
    inline_max_compute_us: float = typer.Option(250.0, help=f"CPU ONNX Runtime models whose EWMA compute per request is at most this (µs) run on the worker's event loop instead of its inference thread (0 = never), in {interval(0, MAX_INLINE_COMPUTE_US)}."),
    chunk_rows: int = typer.Option(1024, help=f"A request of more rows than this to a model that batches (max_batch_size > 0) runs on the inference thread in chunks of this many rows, small requests answered between them (0 = never split), in {interval(0, MAX_CHUNK_ROWS)}."),
    max_pending: int = typer.Option(100_000, help=f"Requests an ingress may have outstanding, in {interval(1, MAX_COUNT)}.", rich_help_panel=_REL),
    max_backlog_msgs: int = typer.Option(10_000, help=f"Requests waiting in an ingress's subscription beyond which new ones get RESOURCE_EXHAUSTED at once, in {interval(1, MAX_BACKLOG_MSGS)}.", rich_help_panel=_REL),
    max_backlog_bytes: int = typer.Option(64 * 1024 * 1024, help=f"The same bound in bytes, in {interval(1, MAX_BACKLOG_BYTES)}.", rich_help_panel=_REL),
    default_timeout_ms: float = typer.Option(1000.0, help=f"Budget of a request without Inferbus-Timeout-Ms (ms), in {interval(0, MAX_TIMEOUT_MS, lo_open=True)}.", rich_help_panel=_REL),
    l2_timeout_ms: float = typer.Option(2.0, help=f"An L2 lookup slower than this is a miss (ms), in {interval(0, MAX_TIMEOUT_MS, lo_open=True)}.", rich_help_panel=_REL),
    l2_pool_size: int = typer.Option(64, help=f"Redis connections per ingress for L2 lookups, in {interval(1, MAX_L2_POOL_SIZE)} (Valkey's default maxclients).", rich_help_panel=_REL),
    l2_breaker_failures: int = typer.Option(20, help=f"L2 lookups failed or timed out in a row that turn an ingress's lookups off for --l2-breaker-open-s, in {interval(1, MAX_COUNT)}.", rich_help_panel=_REL),
    l2_breaker_open_s: float = typer.Option(1.0, help=f"Seconds L2 lookups stay off after that; then the next miss's lookup probes Valkey, in {interval(0, MAX_PERIOD_S, lo_open=True)}.", rich_help_panel=_REL),
    max_request_bytes: int = typer.Option(0, help="Largest request body in bytes (0 = NATS max_payload), in "
                                          f"{interval(0, MAX_MAX_PAYLOAD_BYTES)} (nats-server's ceiling); with the "
                                          "embedded nats-server at most --nats-max-payload.", rich_help_panel=_REL),
    max_tensor_bytes: int = typer.Option(0, help=f"Largest input tensor in bytes (0 = no limit beyond the body), in {interval(0, MAX_TENSOR_BYTES)} ({binary_size(MAX_TENSOR_BYTES)}: the most values a body of 64 MiB carries).", rich_help_panel=_REL),
    max_bytes_elements: int = typer.Option(65_536, help=f"Most elements of one BYTES input (0 = no limit), in {interval(0, MAX_BYTES_ELEMENTS)}: each is a "
                                           "Python object the ingress makes on its event loop.", rich_help_panel=_REL),
    nats_max_payload: int = typer.Option(8 * 1024 * 1024, help=f"max_payload of the embedded nats-server (bytes), in "
                                         f"{interval(MIN_MAX_PAYLOAD_BYTES, MAX_MAX_PAYLOAD_BYTES)} "
                                         f"({binary_size(MIN_MAX_PAYLOAD_BYTES)} to {binary_size(MAX_MAX_PAYLOAD_BYTES)}).",
                                         rich_help_panel=_REL),
    fault_injection: bool = typer.Option(False, hidden=True, help="Workers obey FaultSet on <p>._ctl.<worker> (tests, drills)."),
    audit: bool = typer.Option(False, "--audit", help="Workers publish the request ids they ran on <p>._audit (a MessagePack list of strings per batch, header Inferbus-Worker-Id: the worker), for counting duplicate executions in your own drills; turns the run-now fast path off.", rich_help_panel=_REL),
    peer_query_timeout_ms: float = typer.Option(5.0, hidden=True, help=f"How long a retry asks peer ingresses for its first copy's worker (ms), in {interval(0, MAX_TIMEOUT_MS, lo_open=True)}."),
    # security: credentials for every connection (also required by an embedded nats-server: token, user)
    nats_user: Optional[str] = typer.Option(None, envvar="INFERBUS_NATS_USER", help="User name (with --nats-password).", rich_help_panel=_SEC),
    nats_password: Optional[str] = typer.Option(None, envvar="INFERBUS_NATS_PASSWORD", help="Prefer the env var: argv is public.", rich_help_panel=_SEC),
    nats_token: Optional[str] = typer.Option(None, envvar="INFERBUS_NATS_TOKEN", help="Prefer the env var: argv is public.", rich_help_panel=_SEC),
    nats_nkey_seed: Optional[Path] = typer.Option(None, help="NKey seed file.", rich_help_panel=_SEC),
    nats_creds: Optional[Path] = typer.Option(None, help="User credentials (.creds: JWT + NKey) file.", rich_help_panel=_SEC),
    tls_ca: Optional[Path] = typer.Option(None, help="CA bundle that signed the NATS servers' certificates.", rich_help_panel=_SEC),
    tls_cert: Optional[Path] = typer.Option(None, help="Client certificate (mutual TLS).", rich_help_panel=_SEC),
    tls_key: Optional[Path] = typer.Option(None, help="Client certificate's key.", rich_help_panel=_SEC),
):
    """Serve models: embedded nats-server + Valkey, supervisor, ingress, workers, aggregator."""
    from .actors import Node, NodeConfig

    if log_format == "json":  # every line up prints from here on is a JSON object, its refusals included
        _print_json_lines(ctx, f"node-{node_id}")
    if demo and not 0 < demo_duration <= MAX_DEMO_DURATION_S:
        _usage(f"up: --demo-duration must be in {interval(0, MAX_DEMO_DURATION_S, lo_open=True)} seconds, got "
               f"{number_as_typed(demo_duration)}")
    _check_security_files(nats_nkey_seed, nats_creds, tls_ca, tls_cert, tls_key)
    _check_log_options("up", log_level, log_format)
    run_dir = _folder_option("up", "--run-dir", run_dir)

    def given(name: str) -> bool:
        return _given(ctx, name)

    for value, option, env in ((nats_token, "--nats-token", "INFERBUS_NATS_TOKEN"),
                               (nats_user, "--nats-user", "INFERBUS_NATS_USER"),
                               (nats_password, "--nats-password", "INFERBUS_NATS_PASSWORD")):
        if value is not None and not value.strip():  # `--nats-token "$TOKEN"` with TOKEN unset served with no auth
            _usage(f"up: {option} (or {env}) is empty: give the secret, or leave the option out to run the "
                   f"embedded nats-server without authentication")
    if (nats_user is None) != (nats_password is None):  # the server refused the one given: "cannot reach NATS"
        _usage(f"up: {'--nats-user' if nats_user is not None else '--nats-password'} needs "
               f"{'--nats-password' if nats_user is not None else '--nats-user'} (or INFERBUS_NATS_PASSWORD / "
               f"INFERBUS_NATS_USER)")
    if nats_url is None:  # the embedded nats-server is started with user/password or a token, never these
        external = [o for n, o in (("tls_ca", "--tls-ca"), ("tls_cert", "--tls-cert"), ("tls_key", "--tls-key"),
                                   ("nats_nkey_seed", "--nats-nkey-seed"), ("nats_creds", "--nats-creds")) if given(n)]
        if external:
            _usage(f"up: {' and '.join(external)} {'apply' if len(external) > 1 else 'applies'} to a NATS given "
                   f"with --nats-url (the embedded nats-server is started without TLS or NKey authentication; "
                   f"--nats-user/--nats-password or --nats-token secure it)")
    if json_out is not None and not demo:  # it was ignored without a word: only the demo writes results
        _usage("up: --json writes the demo's results and needs --demo; add --demo or leave it out")
    if given("demo_duration") and not demo:
        _usage("up: --demo-duration is the demo's step length and needs --demo; add --demo or leave it out")
    if nats_url is not None:  # they configure the embedded nats-server, which --nats-url replaces
        embedded_only = [o for n, o in (("nats_port", "--nats-port"), ("nats_max_payload", "--nats-max-payload"))
                         if given(n)]
        if embedded_only:
            many = len(embedded_only) > 1
            _usage(f"up: {' and '.join(embedded_only)} {'configure' if many else 'configures'} the embedded "
                   f"nats-server, which --nats-url replaces; leave {'them' if many else 'it'} out or drop --nats-url")
    if json_out is not None:
        _check_output_file("--json", json_out)
    # each of the two options has two names: a refusal names the one typed (--http-port 70000 was refused as
    # "--metrics-port must be ...")
    port_flag, host_flag = (_typed_name(f"--http-{o}", f"--metrics-{o}") for o in ("port", "host"))
    if metrics_port is None and host_flag == "--http-host":  # the port not given: named as the host was
        port_flag = "--http-port"
    if given("metrics_host") and metrics_port is None:  # it was ignored without a word
        _usage(f"up: {host_flag} is the HTTP endpoint's address and needs {port_flag}; add {port_flag} "
               "or leave it out")
    if given("http_idle_timeout_s") and metrics_port is None:
        _usage("up: --http-idle-timeout-s is the HTTP port's and needs --metrics-port (alias --http-port); add it "
               "or leave --http-idle-timeout-s out")
    if not 0 < http_idle_timeout_s <= 3600:
        _usage(f"up: --http-idle-timeout-s must be in {interval(0, 3600, lo_open=True)}, got "
               f"{number_as_typed(http_idle_timeout_s)}")
    if given("http_max_connections") and metrics_port is None:
        _usage("up: --http-max-connections is the HTTP port's and needs --metrics-port (alias --http-port); add it "
               "or leave --http-max-connections out")
    if not 1 <= http_max_connections <= MAX_HTTP_CONNECTIONS:
        _usage(f"up: --http-max-connections must be in {interval(1, MAX_HTTP_CONNECTIONS)}, got "
               f"{http_max_connections}")
    if given("http_processes") and metrics_port is None:
        _usage("up: --http-processes serves the HTTP port and needs --metrics-port (alias --http-port); add it or "
               "leave --http-processes out")
    if not 0 <= http_processes <= MAX_HTTP_PROCESSES:
        _usage(f"up: --http-processes must be in {interval(0, MAX_HTTP_PROCESSES)}, got {http_processes}")
    if http_infer and metrics_port is None:
        _usage("up: --http-infer serves inference on the HTTP port and needs --metrics-port (alias --http-port); "
               "add it or leave --http-infer out")
    if http_model_control and metrics_port is None:
        _usage("up: --http-model-control serves model load and unload on the HTTP port and needs --metrics-port "
               "(alias --http-port); add it or leave --http-model-control out")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        _usage(f"up: {port_flag} must be in [0, 65535] (0 = any free port), got {metrics_port}")
    _check_tracing(trace_otlp_endpoint, trace_ratio, given("trace_ratio"))
    if run_to_completion and not colocate:  # it was silently ignored: only a colocated ingress has its worker at hand
        _usage("up: --run-to-completion needs --colocate (only an ingress with its worker in the same process can "
               "run a request to completion); add --colocate or leave it out")
    run_to_completion = True if run_to_completion is None else run_to_completion

    serving = dict(
        health_timeout_s=health_timeout_s, mailbox_size=mailbox_size, nats_max_payload_bytes=nats_max_payload,
        worker_options=dict(health_window_s=health_window_s, fault_control=fault_injection,
                            inline_max_compute_us=inline_max_compute_us, chunk_rows=chunk_rows),
        ingress_options=dict(
            max_error_rate=max_error_rate, min_window_requests=min_window_requests, breaker_failures=breaker_failures,
            breaker_open_s=breaker_open_s, rate_limit_per_s=rate_limit, rate_burst=rate_burst,
            client_rate_limit_per_s=client_rate_limit, client_rate_burst=client_rate_burst,
            hedge_budget_ratio=hedge_budget, max_pending=max_pending, default_timeout_ms=default_timeout_ms,
            l2_timeout_ms=l2_timeout_ms, l2_pool_size=l2_pool_size, l2_breaker_failures=l2_breaker_failures,
            l2_breaker_open_s=l2_breaker_open_s, max_request_bytes=max_request_bytes,
            max_tensor_bytes=max_tensor_bytes, max_bytes_elements=max_bytes_elements, max_backlog_msgs=max_backlog_msgs, max_backlog_bytes=max_backlog_bytes,
            peer_query_timeout_ms=peer_query_timeout_ms, run_to_completion=run_to_completion,
            **({} if forget_after_s is None else {"forget_after_s": forget_after_s})),
        bus_options={k: str(v) for k, v in dict(
            user=nats_user, password=nats_password, token=nats_token, nkeys_seed=nats_nkey_seed,
            user_credentials=nats_creds, tls_ca_file=tls_ca, tls_cert_file=tls_cert, tls_key_file=tls_key).items()
            if v is not None},
    )

    models_dir = _models_dir(_folder_option("up", "--models", models))  # '' was the current folder
    repo = _check_models_repo("up", models_dir)
    if not 0 <= nats_port <= 65535:
        _usage(f"up: --nats-port must be in [0, 65535] (0 = any free port), got {nats_port}")
    from urllib.parse import urlsplit

    if redis_url is not None and "@" in "".join(urlsplit(redis_url)[2:]):  # path, query, fragment
        # `redis://:pa@ss@host/0` went to host "ss"... and the error named a piece of the password (a trial)
        _usage("up: --redis-url (or INFERBUS_REDIS_URL) has an '@' after its host: a password with reserved "
               "characters (@ : / % # ?) must be percent-encoded, e.g. urllib.parse.quote(password, safe='')")
    if redis_url is not None and not re.match(r"(redis|rediss|unix)://", redis_url):
        from .bus import shown_url

        _usage(f"up: --redis-url must start with redis://, rediss:// or unix://, got {shown_url(redis_url)!r}")
    unknown = sorted(set(model or ()) - {m.name for m in repo})
    if unknown:
        _usage(f"up: --model {', '.join(unknown)}: not in the model repository {models_dir} (it has "
               f"{', '.join(sorted(m.name for m in repo)) or 'no models'})")
    _note_if_no_models(models_dir, repo)
    if nats_url is not None:
        nats_url = _check_nats_urls(nats_url)
    if spread_servers and (nats_url is None or "," not in nats_url):
        err_console.print("[yellow]note[/]: --spread-servers has nothing to spread with one NATS server "
                          f"({nats_url or 'the embedded one'}): give several, comma-separated, with --nats-url")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", node_id):
        _usage(f"up: --node-id must be 1-64 letters, digits, '-' or '_' (it becomes part of NATS subjects), "
               f"got {node_id!r}")
    if (region or given("region")) and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", region):
        _usage(f"up: --region must be 1-64 letters, digits, '-' or '_', got {region!r}")
    _check_accelerator_env()
    backend_names = tuple(b.strip() for b in backends.split(",") if b.strip())
    if not backend_names:  # it was taken as the default (onnxruntime) without a word
        _usage(f"up: --backends {backends!r} names no backend; give one or more of {', '.join(BACKENDS)}, "
               f"comma-separated")
    twice = sorted({b for b in backend_names if backend_names.count(b) > 1})
    if twice:  # two workers of one backend would share a child id in the node's supervisor
        _usage(f"up: --backends {backends!r} names {', '.join(twice)} more than once; give each backend once")
    if colocate and ingress != 1 and "onnxruntime" in backend_names:  # it was ignored without a word
        _usage(f"up: --ingress {ingress} does not apply with --colocate (each CPU worker slot is one process, an "
               f"ingress with its worker: --workers sets both); leave --ingress out or drop --colocate")
    nats_cores: tuple[int, ...] = ()
    if nats_cpus is not None:
        try:
            nats_cores = parse_cpu_list(nats_cpus)
        except ValueError as exc:
            _usage(f"up: --nats-cpus {exc}")
        if not pin_cpus and nats_url is None:
            err_console.print(f"[yellow]note[/]: --nats-cpus keeps nats-server on {cores_phrase(nats_cores)}, but "
                              "the actors are not pinned and may run there too; add --pin-cpus to keep them off")
    try:
        cfg = NodeConfig(models_dir=models_dir, models=tuple(dict.fromkeys(model or ())), workers=workers,
                         ingress=ingress, colocate=colocate,
                         node_id=node_id, region=region,
                         nats_url=nats_url, spread_servers=spread_servers,
                         nats_port=nats_port, redis_url=redis_url, no_cache=no_cache, l2_lookup=l2_lookup,
                         prefix=prefix, pin_cpus=pin_cpus, nats_cpus=nats_cores, busy_poll_us=busy_poll_us,
                         run_dir=str(run_dir) if run_dir else None,
                         backends=backend_names, precision=precision,
                         metrics_port=metrics_port, metrics_host=metrics_host, http_infer=http_infer,
                         http_model_control=http_model_control, http_idle_timeout_s=http_idle_timeout_s, http_max_connections=http_max_connections,
                         http_processes=http_processes, audit=audit,
                         log_level=log_level, log_format=log_format,
                         trace_otlp_endpoint=trace_otlp_endpoint, trace_ratio=trace_ratio, **serving)
    except ValueError as exc:  # a value the node's own checks refuse (e.g. --busy-poll-us inf), named as an option
        _usage(f"up: {_with_flags(str(exc), up)}")
    if no_cache:  # the cache was off and these ignored without a word
        l2_options = [o for n, o, on in (("redis_url", "--redis-url (or INFERBUS_REDIS_URL)", True),
                                         ("l2_lookup", "--l2-lookup", l2_lookup),
                                         ("l2_pool_size", "--l2-pool-size", True),
                                         ("l2_timeout_ms", "--l2-timeout-ms", True),
                                         ("l2_breaker_failures", "--l2-breaker-failures", True),
                                         ("l2_breaker_open_s", "--l2-breaker-open-s", True)) if on and given(n)]
        if l2_options:
            _usage(f"up: --no-cache turns the L2 cache off, so {' and '.join(l2_options)} cannot apply; give one or "
                   f"the other")
    _check_backends_installed(backend_names)
    made = _check_run_dir(run_dir) if run_dir is not None else []
    try:  # a usage error from here on takes away the --run-dir folders the check made, while empty
        # after the option checks: a bad value is named first
        if nats_url is None and nats_port and _port_busy(nats_port):
            if not demo or given("nats_port"):  # only the demo's default port moves: one asked for is kept or refused
                _usage(_port_taken(nats_port))
            cfg = replace(cfg, nats_port=0)
        if metrics_port is not None:  # before anything starts: a port taken (or, 0 too, a host not here) is one line
            problem = _cannot_listen(metrics_host, metrics_port)
            if problem:
                _usage(f"up: {port_flag} {metrics_port}: cannot listen on {metrics_host}:{metrics_port}: {problem}")
    except typer.Exit:
        _remove_made_folders(made)
        raise
    last = _LastLine()
    try:
        rc = _run(_up(cfg, demo, demo_duration, json_out, last))
    except Exception as exc:  # the port check above and nats-server's own bind race (two 'up' at the same moment)
        from .bus._embedded import EmbeddedServerError

        if not (isinstance(exc, EmbeddedServerError) and "address already in use" in str(exc) and nats_url is None):
            raise
        _remove_made_folders(made)  # (kept when the node wrote its logs there)
        _usage(_port_taken(cfg.nats_port, " (taken while this node started)"))
    last.say()
    raise typer.Exit(rc)


def _check_log_options(command: str, log_level: str, log_format: str) -> None:
    """``--log-level`` and ``--log-format`` of ``command`` (``up``, ``cluster up``): one of their choices
    (:data:`~inferbus._limits.LOG_LEVELS`, :data:`~inferbus._limits.LOG_FORMATS`), as typed (lower case), or the
    usage error ``<command>: --log-level must be one of debug, info, warning, error, got 'verbose'``."""
    for option, value, choices in (("--log-level", log_level, LOG_LEVELS), ("--log-format", log_format, LOG_FORMATS)):
        if value not in choices:
            _usage(f"{command}: {option} must be one of {', '.join(choices)}, got {value!r}")


def _child_start_failure(exc) -> tuple[str, int]:
    """One line and the exit status for an actor process that did not start (``ChildStartError``): a model the
    worker could not load (its one ``UNSERVABLE_PREFIX`` line) is ``up: the model repository cannot be served:
    ...``, exit 2; anything else names the child and its last line of output, exit 1."""
    from .actors._repository import UNSERVABLE_PREFIX

    said = [line.strip() for line in exc.output if line.strip()]
    child = exc.child_id or "an actor process"
    for line in reversed(said):
        if line.startswith(UNSERVABLE_PREFIX):
            return (f"up: the model repository cannot be served: {child}: {line[len(UNSERVABLE_PREFIX):]}",
                    EXIT_USAGE)
    why = " ".join(str(exc).split("; last output:")[0].split())
    return f"up: {why}" + (f"; its last output: {said[-1]}" if said else ""), EXIT_FAILED


class _LastLine:
    """The line that ends a stop of ``up`` or ``cluster up`` (``inferbus stopped in 0.42s after serving 12s``), said
    once everything the command waits for is over: the stop (for ``up --demo``, the load run's own end first), then
    the event loop's end (its last tasks cancelled, its executor's threads joined), so that its figure is the time
    from the stop's start (the first signal; a failure or a closed output where no signal came) to then, and nothing
    the command still does comes after it but the interpreter's exit. Until 2026-12-07 the line came from inside the
    loop and its clock started after the demo's end: a fresh-user trial read ``stopped in 0.18s`` from an
    interrupted ``up --demo`` that exited 3.3 s after its SIGINT, and ``cluster stopped in 0.9s`` from one that took
    3.2 s.

    ``set(since, say)``: the stop began at ``since`` (:func:`time.monotonic`); ``say(elapsed_s)`` prints the line.
    :meth:`say` (the command, after its loop ended) calls it at most once; nothing set: nothing said. Its output
    found closed then (``... | head -1``) is dropped, as one found closed during the stop was (:class:`_Output`'s
    handler; the exit status is :func:`main`'s: 141 where it would have been 0)."""

    def __init__(self) -> None:
        self.since: float = 0.0
        self._say = None

    def set(self, since: float, say) -> None:
        self.since, self._say = since, say

    def say(self) -> None:
        import time

        say, self._say = self._say, None
        if say is None:
            return
        _ClosedOutput.handler = lambda: None
        try:
            say(time.monotonic() - self.since)
        finally:
            _ClosedOutput.handler = None


async def _up(cfg, demo: bool, demo_duration: float, json_out: Optional[Path],
              last: "_LastLine | None" = None) -> int:
    """Serve until a signal (with ``demo``: run the load run); see :func:`_up_body`. When it returns, SIGINT and
    SIGTERM are ignored until the process exits: a signal that comes after the stop finished would otherwise find
    the loop's handlers gone (closing the loop restores the default action) and end the process by the signal,
    not with the exit status the stop chose (a fresh-user trial: a second Ctrl-C 0.1-0.3 s after a start-up stop)."""
    import asyncio
    import logging

    from ._logs import LEVELS, JsonFormatter

    loop = asyncio.get_running_loop()
    records, stderr = logging.getLogger("inferbus"), None
    if not logging.getLogger().handlers and not records.handlers:  # (where no application configured logging)
        # the node's records on stderr (WARNING and up, or --log-level if higher; the message alone, as the node's
        # own handler writes them: a supervisor's "child 'worker:n1-w0' (pid 7) exited: killed by signal 9
        # (SIGKILL)"), wrapped as up's lines are (the node adds no handler of its own then); they were not wrapped
        # at all (a fresh-user trial). With --log-format json: one JSON object per record, never wrapped
        stderr = logging.StreamHandler()
        stderr.setLevel(max(LEVELS[cfg.log_level], logging.WARNING))
        stderr.setFormatter(JsonFormatter(f"node-{cfg.node_id}") if cfg.log_format == "json"
                            else _wrapped_records("%(message)s"))
        records.addHandler(stderr)
    try:
        return await _up_body(cfg, demo, demo_duration, json_out, last if last is not None else _LastLine())
    finally:
        if stderr is not None:
            records.removeHandler(stderr)
        _ClosedOutput.handler = None  # a closed output from here ends the command (main(): 141)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread: nothing to keep
                pass


def _wrapped_records(fmt: str):
    """A :class:`logging.Formatter` of ``fmt`` that wraps every line of a record's message between words to
    :func:`_err_wrap_width` (:func:`~inferbus._wrap.wrap_words`: the lines after the first indented by 4); a
    traceback is left as it is. (Made here: ``logging`` is imported by ``up`` alone.)"""
    import logging

    from ._wrap import wrap_words

    class WrappedRecords(logging.Formatter):
        def formatMessage(self, record) -> str:
            width = _err_wrap_width()
            return "\n".join(out for line in super().formatMessage(record).split("\n") for out in wrap_words(line, width))

    return WrappedRecords(fmt)


SAME_SIGNAL_S = 0.1
"""A signal that repeats the first within this many seconds is taken as the same one (``up``): a person's second
Ctrl-C comes later than that; a `timeout`'s two copies of its SIGTERM (to the child, then to its group) do not."""


async def _up_body(cfg, demo: bool, demo_duration: float, json_out: Optional[Path], last: _LastLine) -> int:
    """Serve until a signal (with ``demo``: run the load run). Exit statuses of a stop by signal (SIGINT, SIGTERM):
    while serving, a graceful stop is 0; a second signal during any stop kills everything, 128 + that signal
    (130 SIGINT, 143 SIGTERM); a start-up or a demo that a signal interrupted is 128 + the first signal. A graceful
    stop's last line (``inferbus stopped ...``) is left in ``last`` for the command to say once the loop has ended."""
    import asyncio
    import time

    t0 = time.monotonic()
    # the handlers go in first, before the imports below (~1 s) and before anything starts: from here on a
    # SIGINT/SIGTERM is never a KeyboardInterrupt or a default-action death that would leave a start half done.
    # They go in even when SIGINT came in ignored (a background job of a non-interactive shell): the drain needs them
    loop = asyncio.get_running_loop()
    signals: list[int] = []
    stop, again = asyncio.Event(), asyncio.Event()  # the first signal: stop gracefully; a second one: kill
    first_at = [0.0]

    def on_signal(signum: int) -> None:
        now = time.monotonic()
        if stop.is_set() and signals and signum == signals[0] and now - first_at[0] < SAME_SIGNAL_S:
            return  # the same signal again at once: one sender's two (GNU `timeout` signals its child and then its
            # process group: a fresh-user trial saw `timeout 30 inferbus up` killed without a drain), not a second
        if not stop.is_set():
            first_at[0] = now
        signals.append(signum)
        (again if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    def on_closed_output() -> None:  # stdout or stderr is a closed pipe (`inferbus up | head -1`): as a first signal
        if not stop.is_set():  # (in a stop already: it goes on; a second real signal still kills)
            first_at[0] = time.monotonic()
            signals.append(signal.SIGPIPE)  # its status: 128 + SIGPIPE (main() makes a 0 that too)
            stop.set()

    _ClosedOutput.handler = lambda: loop.call_soon_threadsafe(on_closed_output)  # (reset by _up when it returns)

    from nats.errors import NoServersError

    from .accelerators import BackendUnavailable
    from .actors import Node
    from .actors._node import MetricsPortUnavailable, ModelsUnservable, NodeIdInUse, RunDirInUse
    from .bus import shown_servers, shown_url, split_servers
    from .supervisor import ChildStartError

    node = Node(cfg)

    async def start() -> None:
        await node.start()
        await node.wait_ready(60)

    async def stop_start() -> int:
        """A signal came during start-up: cancel the start (the node stops what it had started, gracefully), or
        kill everything on a second signal."""
        first = signal.Signals(signals[0]).name
        console.print(f"{first} during start-up: stopping what started (Ctrl-C again: stop at once)")
        t_stop = time.monotonic()
        if await _stop_or_kill(node, again, starting):
            err_console.print(f"inferbus killed {time.monotonic() - t_stop:.2f}s after the stop began, during "
                              f"start-up")
            return 128 + signals[1]
        last.set(first_at[0], lambda took_s: err_console.print(
            f"inferbus stopped during start-up ({first}), {took_s:.2f}s after the signal; nothing served"))
        return 128 + signals[0]

    starting = asyncio.ensure_future(start())
    interrupted = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        interrupted.cancel()
        if not starting.done():
            return await stop_start()
        try:
            starting.result()
        except (NodeIdInUse, RunDirInUse) as exc:  # (it was "cannot start: ...", without the "error: up: " of others)
            err_console.print(f"[red]error[/]: up: {escape(str(exc))}")
            return EXIT_USAGE
        except MetricsPortUnavailable as exc:  # taken between the check and the start: nothing is left running
            err_console.print(f"[red]error[/]: up: {_typed_name('--http-port', '--metrics-port')}: {escape(str(exc))}")
            return EXIT_USAGE
        except BackendUnavailable as exc:  # installed but unusable here (no GPU, a broken import): the device probe
            err_console.print(f"[red]error[/]: up: --backends {escape(','.join(cfg.backends))}: "
                              f"{escape(' '.join(str(exc).split()))}")
            return EXIT_USAGE
        except NoServersError as exc:  # --nats-url: none of them accepted the node's connection
            raise NatsUnreachable(f"cannot reach NATS at {shown_servers(cfg.nats_url or '')}: {exc}",
                                  list(split_servers(cfg.nats_url or ""))) from exc
        except ChildStartError as exc:  # an actor process died before READY (the node stopped what had started)
            line, rc = _child_start_failure(exc)
            err_console.print(f"[red]error[/]: {escape(line)}", soft_wrap=True)
            return rc
        except ModelsUnservable as exc:  # a model no backend given can run: say which and why, at once
            for key, why in sorted(exc.reasons.items()):
                name, _, version = key.rpartition(":")
                workers = "; ".join(f"{w}: {' '.join(r.split())}" for w, r in sorted(why.items()))
                err_console.print(f"[red]error[/]: up: model {escape(name)!r} version {escape(version)}: no worker "
                                  f"could load it ({escape(workers)})", soft_wrap=True)
            err_console.print(f"up: serve these with another backend (--backends, e.g. onnxruntime,"
                              f"{','.join(b for b in cfg.backends if b != 'onnxruntime') or 'jax'}) or leave them out "
                              f"(--model NAME for each model to serve, or a --models folder without them)",
                              soft_wrap=True)
            return EXIT_USAGE
        except TimeoutError as exc:
            err_console.print(f"[red]error[/]: up: {escape(str(exc))}", soft_wrap=True)
            return 1
        if stop.is_set():  # the signal came as the start finished
            return await stop_start()
        nats_where = f" (nats-server on {cores_phrase(cfg.nats_cpus)})" if cfg.nats_cpus else ""
        parts = [f"NATS {shown_servers(node.nats_url)}{nats_where}",
                 f"L2 cache {shown_url(node.redis_url) if node.redis_url else 'off'}",
                 f"{len(node.worker_ids)} worker(s)",
                 f"{node.n_ingress} ingress{' (colocated with the CPU workers)' if cfg.colocate else ''}",
                 *([f"{cfg.http_processes} HTTP process{'es' if cfg.http_processes > 1 else ''}"]
                   if cfg.http_processes else []),
                 *([f"busy polling {cfg.busy_poll_us:.0f} µs"] if cfg.busy_poll_us else []),
                 *([f"actors pinned to {cores_phrase(node.serving_cores)}"] if cfg.pin_cpus else []),
                 f"run dir {node.run_dir}"]
        # on a terminal (or piped with COLUMNS) wrapped between its parts; in a log one line: it is grepped for
        width = _wrap_width()
        for line in _marked_lines([("inferbus up", "bold green"), (f" in {time.monotonic() - t0:.2f}s —", "")],
                                  [f"{part}," for part in parts[:-1]] + parts[-1:], width):
            console.print(line, soft_wrap=width is None)
        if node.metrics is not None:
            address = _http_address(cfg.metrics_host, node.http_port)
            console.print(f"  metrics http://{address}/metrics", soft_wrap=True)
            console.print(f"  {_oip_line(address, cfg.http_infer, cfg.http_model_control)}", soft_wrap=True)
            if (cfg.http_infer or cfg.http_model_control) and not _is_loopback(cfg.metrics_host):
                err_console.print(f"[yellow]note[/]: {_open_inference_note(address, cfg.http_infer, cfg.http_model_control)}")
        if cfg.busy_poll_us:
            polling = sum(1 for c in node.supervisor.which_children()
                          if c.id.split(":")[0] in ("worker", "ingress", "colocated"))
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            # the embedded nats-server needs a core of its own too (and the clients, which we cannot count)
            embedded = 1 if cfg.nats_url is None else 0
            if polling + embedded > cores:
                err_console.print(f"[yellow]note[/]: {polling} busy-polling processes"
                                  f"{' and the embedded nats-server' if embedded else ''} on {cores} cores: they share "
                                  f"cores and slow each other down, and requests wait longer; start fewer (--workers, "
                                  f"--ingress, or --colocate) and leave cores for nats-server and the clients")
        if cfg.redis_url and not cfg.no_cache:
            problem = await _redis_problem(cfg.redis_url)
            if problem and problem.startswith("Authentication"):  # redis-py's AuthenticationError and kin
                # it answered, and a wrong password does not fix itself (it said "does not answer ... until it does")
                err_console.print(f"[yellow]warning[/]: the L2 cache at {escape(shown_url(cfg.redis_url))} refused "
                                  f"the credentials ({escape(problem)}); serving without L2: fix the password in "
                                  f"--redis-url (or INFERBUS_REDIS_URL) and restart")
            elif problem:
                err_console.print(f"[yellow]warning[/]: the L2 cache at {escape(shown_url(cfg.redis_url))} does not answer "
                                  f"({escape(problem)}); serving without L2 until it does")
        from .actors import ModelRepository
        from .actors._repository import RepositoryError

        try:
            repo = ModelRepository(cfg.models_dir, list(cfg.models) or None)
        except RepositoryError as exc:
            # a folder broken between the check before the start and this line (a file being written, or edited by
            # hand): the node serves what it loaded; read as a restarted actor reads it (a CI run: `up` died of
            # this ModelConfigError right after "inferbus up in ...", taking the node down)
            err_console.print(f"[yellow]note[/]: the model repository changed during the start and cannot be read "
                              f"whole ({escape(' '.join(str(exc).split()))}); listing what can be read")
            repo = ModelRepository(cfg.models_dir, list(cfg.models) or None, need={})
        for m in repo:
            for line in _model_line(m.name, sorted(m.versions, key=int), cfg.prefix, width or console.width):
                console.print(line)
        own = " and ".join(n for n, srv in (("nats-server", node.nats), ("valkey", node.valkey)) if srv is not None)
        stopping_line = (("the HTTP port takes no new requests and answers those it has, then "
                          if node.metrics is not None else "")
                         + "the ingresses stop taking requests and the workers finish theirs"
                         + (f", then the embedded {own}" if own else "") + " (Ctrl-C again: stop at once, no drain)")

        def say_stopping() -> None:  # wrapped as the first line: between words, further lines indented by 4
            for line in _marked_lines([("stopping:", "")], stopping_line.split(), width):
                console.print(line, soft_wrap=width is None)
        if demo:
            run = asyncio.ensure_future(_demo(node, cfg, repo, demo_duration, json_out))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if run.done():
                stopped.cancel()
                rc = run.result()
                if await _stop_or_kill(node, again if stop.is_set() else stop):  # a signal now: stop at once
                    return 128 + signals[-1]
                return rc
            run.cancel()  # Ctrl-C during the demo: stop the load run, then the node
            await asyncio.gather(run, return_exceptions=True)
            err_console.print(f"demo interrupted ({signal.Signals(signals[0]).name})")
            say_stopping()
            if await _stop_or_kill(node, again):
                err_console.print("inferbus killed during the stop after the demo")
                return 128 + signals[1]
            # (the clock from the signal: the load run's end, its client's drain included, is part of the stop)
            last.set(first_at[0], lambda took_s: console.print(f"inferbus stopped in {took_s:.2f}s after the "
                                                               f"interrupted demo"))
            return 128 + signals[0]
        console.print("serving; Ctrl-C to stop")
        t_serving = time.monotonic()
        stopped, failed = asyncio.ensure_future(stop.wait()), asyncio.ensure_future(node.wait_failed())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if failed.done():  # a supervisor escalated: exit non-zero so systemd/k8s act
            for line in _marked_lines([("inferbus up stopped", "red"), (":", "")], str(failed.result()).split(),
                                      _err_wrap_width()):
                err_console.print(line)
            return 1
        failed.cancel()
        say_stopping()
        t_stop = time.monotonic()
        if await _stop_or_kill(node, again):
            err_console.print(f"inferbus killed {time.monotonic() - t_stop:.2f}s after the stop began, after serving "
                              f"{t_stop - t_serving:.0f}s; requests in flight were not answered")
            return 128 + signals[1]
        served_s = first_at[0] - t_serving
        last.set(first_at[0], lambda took_s: console.print(f"inferbus stopped in {took_s:.2f}s after serving "
                                                           f"{served_s:.0f}s"))
        return 0
    finally:
        starting.cancel()  # (done by now, but for an exception that came from elsewhere)
        await asyncio.gather(starting, return_exceptions=True)
        await node.stop()


async def _stop_or_kill(node, kill: asyncio.Event, starting: "asyncio.Future | None" = None) -> bool:
    """Stop ``node`` gracefully (:meth:`Node.stop`: the ingresses drain, the workers answer what they hold; first
    ``starting``, a start in progress, is cancelled: the node stops what it had started); ``kill`` set meanwhile (a
    second SIGINT or SIGTERM) kills its processes at once instead (:meth:`Node.kill`), as a second Ctrl-C does in
    uvicorn or Ray. True when it was killed."""
    import asyncio

    async def graceful() -> None:
        if starting is not None:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await node.stop()

    stopping = asyncio.ensure_future(graceful())
    waiting = asyncio.ensure_future(kill.wait())
    await asyncio.wait({stopping, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if stopping.done():
        stopping.result()
        return False
    err_console.print("[yellow]second signal[/]: killing the actor processes and the embedded servers now "
                      "(SIGKILL, no drain)")
    await node.kill()
    await asyncio.gather(stopping, return_exceptions=True)
    return True


async def _redis_problem(url: str, timeout_s: float = 1.0) -> str | None:
    """None when the Redis/Valkey at ``url`` answers PING within ``timeout_s``, else why not (one line)."""
    import asyncio

    import redis.asyncio as aioredis

    r = aioredis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        await asyncio.wait_for(r.ping(), timeout_s * 2)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        try:
            await r.aclose()
        except Exception:
            pass


_HOPS = (("ingress", ("decode", "validate", "cache", "route", "ingress_total")), ("forward", ("forward_hop",)),
         ("worker", ("queue", "worker_decode", "compute", "between_chunks", "encode", "worker_total")),
         ("reply", ("reply_hop",)), ("client", ("e2e", "bus_other", "inbound", "send_lag")))
"""The demo's hop-by-hop stages (``parameters.timings_us`` and the client's figures, README), by hop in the order a
request passes them."""


def _model_line(name: str, versions: list[str], prefix: str, width: int) -> list[str]:
    """``up``'s line for model ``name`` (its versions, the subject it is served on) as rich markup lines of at most
    ``width`` characters where they fit: ``  model <name> versions 1, 2 → <prefix>.infer.<name>[.<version>]`` on
    one line, else wrapped between its items (:func:`_marked_lines`): the versions and then ``→`` with the subject
    each whole on a line of their own, indented by 4. rich broke the one line where it ran out of room: on 60 columns
    after the ``→``, left dangling, and mid-subject on fewer or with a longer prefix. An item longer than a line is
    left to the console to fold."""
    return _marked_lines([("  model ", ""), (name, "cyan")],
                         [f"versions {', '.join(versions)}", f"→ {prefix}.infer.{name}[.<version>]"], width)


def _marked_lines(head: list[tuple[str, str]], items: list[str], width: Optional[int]) -> list[str]:
    """``head`` (its pieces of text, each with a rich style or ``""``) then ``items`` as rich markup lines, wrapped
    between items to ``width`` characters (:func:`~inferbus._wrap.wrap_items`), each further line indented by 4; one
    line where ``width`` is None. The wrapping is decided on the plain text (the markup does not count against the
    width); every text is escaped (a model name, a prefix or a path is shown as it is)."""
    from ._wrap import wrap_items

    plain = "".join(text for text, _ in head)
    lines = wrap_items(plain, items, width or sys.maxsize, 4)
    marked = "".join(f"[{style}]{escape(text)}[/]" if style else escape(text) for text, style in head)
    return [marked + escape(lines[0][len(plain):])] + [escape(line) for line in lines[1:]]


def _wrap_width() -> Optional[int]:
    """The width ``up``'s lines are wrapped to: the console's on a terminal, or piped where ``COLUMNS`` is set (as
    ``--help`` follows it); None (one line each) piped without it, into a log, which is grepped for ``inferbus up in``
    and its run dir."""
    if isinstance(console, JsonLinesConsole):
        return None
    return console.width if _stdout_is_a_terminal() or _columns() else None


def _hop_by_hop(stages: dict, width: int) -> list[str]:
    """The demo's hop-by-hop means (µs by stage) as lines of at most ``width`` characters where they fit: a title
    line, then one line per hop in the request's order (:data:`_HOPS`; a stage of none of them on an ``other`` line),
    ``name=value`` items separated by spaces. A hop whose items do not fit goes on over more lines, wrapped between
    items and indented under its first (the one line of items joined by ``, `` that it was wrapped after a comma on a
    narrow terminal, a fresh-user trial); an item longer than a line is left to the console to fold."""
    rows, known = [], set()
    for hop, names in _HOPS:
        known.update(names)
        rows.append((hop, [f"{k}={stages[k]:g}" for k in names if k in stages]))
    rows.append(("other", [f"{k}={v:g}" for k, v in stages.items() if k not in known]))
    rows = [(hop, items) for hop, items in rows if items]
    indent = 2 + max(len(hop) for hop, _ in rows) + 1
    from ._wrap import wrap_items

    lines = ["hop-by-hop means at c=1 (µs):"]
    for hop, items in rows:
        lines += wrap_items(f"  {hop}".ljust(indent) + items[0], items[1:], width, indent)
    return lines


async def _demo(node, cfg, repo, duration_s: float, json_out: Optional[Path]) -> int:
    from .client import Client
    from .loadgen import Workload, closed_loop, open_loop, render_table

    model = "digits" if repo.get("digits") else next(iter(repo)).name
    client = await Client.connect(node.nats_url, cfg.prefix, **cfg.bus_options)
    results = []
    try:
        miss = Workload(repo, model, distinct=True)
        hit = Workload(repo, model, distinct=False)
        # warm-up, not recorded
        await closed_loop(client, miss, concurrency=4, duration_s=0.5)
        results.append(await closed_loop(client, miss, concurrency=1, duration_s=duration_s))
        results.append(await closed_loop(client, miss, concurrency=8, duration_s=duration_s))
        c8_qps = results[-1].qps
        results.append(await open_loop(client, miss, rate_qps=max(round(c8_qps * 0.5, -1), 50), duration_s=duration_s))
        results.append(await closed_loop(client, hit, concurrency=1, duration_s=duration_s))
        results[-1].mode = "closed(hit)"
    finally:
        await client.close()
    console.print(render_table(results, f"inferbus demo — model {model}, {len(node.worker_ids)} worker(s)"))
    stages = results[0].stages_us
    if stages:
        for line in _hop_by_hop(stages, console.width):
            console.print(line, markup=False)
    wrong = sum(r.wrong for r in results)
    errors = sum(sum(r.errors.values()) for r in results)
    console.print(f"wrong answers: [bold]{wrong}[/]   errors: [bold]{errors}[/]")
    if json_out:
        try:  # checked before the node started (_check_output_file); it can still go (removed, disk full)
            json_out.write_text(json.dumps([r.to_dict() for r in results], indent=2))
        except OSError as exc:
            err_console.print(f"[red]error[/]: up: --json {escape(str(json_out))}: cannot write the results: "
                              f"{escape(exc.strerror or str(exc))}")
            return 1
    return 1 if wrong or errors else 0


@app.command(short_help="Send one request built from .npy files; print the outputs.")
def infer(
    model: str = typer.Argument(..., metavar="MODEL", help="Model name."),
    input: list[str] = typer.Option(..., "--input", "-i", metavar="<name>=<file.npy>",
                                    help="An input's name and its .npy file (repeat per input)."),
    version: Optional[str] = typer.Option(None, help="Model version (default: the model's default)."),
    output: list[str] = typer.Option([], "--output", "-o", metavar="<name>",
                                     help="An output to compute (repeat per output; default all)."),
    nats_url: str = typer.Option("nats://127.0.0.1:4222", help="NATS URL(s)."),
    prefix: str = typer.Option("inferbus", help="Subject prefix."),
    timeout_s: float = typer.Option(1.0, help=f"Request budget in seconds, retries included, in {_TIMEOUT_S_RANGE}."),
    json_wire: bool = typer.Option(False, "--json-wire", help="Send JSON instead of MessagePack."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as one JSON object (model_name, "
                                 "model_version, id, outputs: {name: {datatype, shape, data}}, parameters); an "
                                 "error as the wire's error object."),
):
    """Send one request built from .npy files and print the outputs."""
    _check_timeout_s("infer", timeout_s)
    _nats_urls_given("infer", nats_url)
    specs = []
    for spec in input:  # every --input's form first, then the files: nothing read, nothing sent, for a bad one
        name, sep, path = spec.partition("=")
        if not (sep and name and path):  # "x.npy", "=x.npy" (an empty NAME went to the server), "pixels="
            missing = "" if not sep else " (no NAME before '=')" if not name else " (no FILE after '=')"
            raise typer.BadParameter(f"--input takes NAME=FILE.npy, got {spec!r}{missing}")
        specs.append((name, path))
    feeds = {}
    for name, path in specs:
        if name in feeds:
            _usage(f"infer: input {name!r} given twice (--input {name}=...)")
        feeds[name] = _load_npy(path)

    async def go():
        import time

        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        async with await _one_shot_client(nats_url, prefix, timeout_s=timeout_s) as c:
            return await c.infer_result(model, feeds, version=version, outputs=output or None,
                                        timeout_s=_left_s(t_end), json=json_wire)

    res = _call(go, as_json=as_json)
    if as_json:  # one parseable object (the text form is numpy's print and then JSON: a fresh-user trial)
        from .schemas import datatype_of

        outs = {name: {"datatype": datatype_of(arr.dtype), "shape": list(arr.shape),
                       "data": [_json_value(x) for x in arr.ravel().tolist()]}
                for name, arr in res.outputs.items()}
        print(json.dumps({"model_name": res.model_name, "model_version": res.model_version, "id": res.id,
                          "outputs": outs, "parameters": res.parameters}, default=_json_default))
        return
    import numpy as np

    console.print(f"model {res.model_name} version {res.model_version} id {res.id}")
    for name, arr in res.outputs.items():
        console.print(f"[cyan]{escape(name)}[/] {arr.dtype} {list(arr.shape)}")
        # numpy lays the rows out at 75 columns; on a narrower terminal (or COLUMNS) it lays them out at its width,
        # else the console broke each 75-column line again, a row's values strewn over ragged lines
        console.print(np.array2string(arr, precision=5, threshold=2000, max_line_width=min(75, console.width)),
                      markup=False, highlight=False)
    console.print_json(json.dumps(res.parameters, default=str))


_NPY_MAGIC = b"\x93NUMPY"
"""The first bytes of every .npy file (numpy's format, ``numpy.lib.format``)."""


def _load_npy(path: str) -> "np.ndarray":
    """``infer``'s ``--input`` file as an array; any file that is not a numeric or bytes .npy is one line naming the
    file and what is wrong with it, exit 2 (never numpy's own advice to load pickled data, which inferbus refuses)."""
    def refuse(why: str) -> NoReturn:
        _usage(f"cannot read {path}: {why}; --input takes a .npy file (numpy.save) of a numeric or bytes array")

    import math
    import os
    import stat

    import numpy as np

    try:
        st = os.stat(path)
        size = st.st_size
        if stat.S_ISDIR(st.st_mode):
            refuse("Is a directory")
        if not stat.S_ISREG(st.st_mode):  # a FIFO with no writer blocked the open for ever
            refuse("not a regular file")
        with open(path, "rb") as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                refuse("not a .npy file (it does not start with numpy's header)")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            header = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if header is not None:  # what the header promises must be in the file (else numpy allocates it first)
                shape, _, dtype = header(f)
                if not dtype.hasobject:
                    claimed = math.prod(shape) * dtype.itemsize
                    if claimed > size - f.tell():
                        refuse(f"a damaged .npy file (its header says shape {tuple(shape)} of {dtype}, "
                               f"{claimed} bytes, and the file holds {max(size - f.tell(), 0)} after it)")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except OSError as exc:
        refuse(exc.strerror or str(exc))
    except MemoryError:
        refuse("its array does not fit in this machine's memory")
    except (ValueError, EOFError) as exc:
        if "allow_pickle" in str(exc) or "pickled" in str(exc):
            refuse("the array holds Python objects (dtype object), which are not loaded")
        refuse(f"a damaged .npy file ({str(exc)[:200]})")


def _json_value(x):
    """One output element for ``infer --json``, as the wire's JSON writes it (docs/wire.md): a non-finite float as
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (``json.dumps`` wrote bare ``NaN``, which is no JSON), BYTES as text
    (bytes that are not UTF-8 with backslash escapes)."""
    if isinstance(x, float) and not math.isfinite(x):
        from .schemas._codec import _nonfinite_str

        return _nonfinite_str(x)  # the wire's own spelling
    if isinstance(x, bytes):
        return x.decode("utf-8", "backslashreplace")
    return x


def _json_default(x):
    """``json.dumps``'s fallback for ``infer --json``'s parameters: numpy scalars as their Python value, anything
    else as its text."""
    return x.item() if hasattr(x, "item") else str(x)


@app.command(short_help="Ask one ingress whether it is live and ready.")
def health(nats_url: str = typer.Option("nats://127.0.0.1:4222", help="NATS URL(s)."),
           prefix: str = typer.Option("inferbus", help="Subject prefix."),
           timeout_s: float = typer.Option(1.0, help=f"Budget of the probe in seconds, retries included, in "
                                           f"{_TIMEOUT_S_RANGE}."),
           as_json: bool = typer.Option(False, "--json", help="Accepted for scripts that pass it to every command: "
                                        "health prints JSON either way."),
           ingress: Optional[str] = typer.Option(None, "--ingress", metavar="<id>",
                                                 help="Ask this ingress (its parameters.ingress_id, e.g. n1-i0) "
                                                      "instead of any one: with several nodes on one NATS, how one "
                                                      "node's view is read.")):
    """Ask one ingress whether it is live and ready (exit 0 ready, 1 not ready or no ingress answering within
    --timeout-s)."""
    _check_timeout_s("health", timeout_s)
    _nats_urls_given("health", nats_url)
    from .schemas import DeadlineExceeded, InvalidArgument, Unavailable

    if ingress is not None:
        from .client import _subject_token

        try:
            _subject_token(ingress, "--ingress")
        except InvalidArgument as err:
            _usage(f"health: {err.message}")

    async def go():
        import time

        t_end = time.monotonic() + timeout_s  # the connect counts within --timeout-s
        async with await _one_shot_client(nats_url, prefix, timeout_s=timeout_s) as c:
            try:
                return await c.health(timeout_s=_left_s(t_end), ingress=ingress)
            except (Unavailable, DeadlineExceeded) as err:  # no ingress of that prefix answers: down, for a probe
                if ingress is not None:
                    err.message = f"ingress {ingress!r}: {err.message}"
                return err

    h = _call(go)
    if isinstance(h, Exception):
        err_console.print(f"[red]{h.code.value}[/]: {escape(h.message)}")
        raise typer.Exit(EXIT_FAILED)
    console.print_json(json.dumps({"live": h.live, "ready": h.ready, "parameters": h.parameters}))
    raise typer.Exit(0 if h.ready else 1)


@app.command(short_help="Print each node's supervision tree.")
def nodes(nats_url: str = typer.Option("nats://127.0.0.1:4222", help="NATS URL(s)."),
          prefix: str = typer.Option("inferbus", help="Subject prefix."),
          wait_s: float = typer.Option(0.5, help=f"How long to collect the nodes' answers, seconds, in "
                                       f"{_TIMEOUT_S_RANGE}."),
          as_json: bool = typer.Option(False, "--json", help="Print the answers as JSON (a list, one per node).")):
    """Each node's supervision tree: every `inferbus up` on this NATS and prefix answers with its supervisors
    (strategy, intensity, restarts counted against it) and each child's actor ids on the bus (as health and metrics
    name them), pid, status, restarts and last exit, as OTP's which_children gives them (exit 0 when a node answered, 1 when none did within --wait-s)."""
    if not (0 < wait_s <= MAX_TIMEOUT_MS / 1000.0):  # NaN fails the comparison
        _usage(f"nodes: --wait-s must be in {interval(0, MAX_TIMEOUT_MS / 1000.0, lo_open=True)} seconds, "
               f"got {number_as_typed(wait_s)}")
    _nats_urls_given("nodes", nats_url)
    import asyncio

    from .bus import Subjects

    async def go():
        async with await _one_shot_client(nats_url, prefix) as c:
            nc = c.nc
            got: list[dict] = []

            async def take(msg):
                try:
                    got.append(json.loads(msg.data))
                except ValueError:
                    pass

            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox, cb=take)
            await nc.publish(Subjects(prefix).nodes, b"", reply=inbox)
            await asyncio.sleep(wait_s)
            await sub.unsubscribe()
            return sorted(got, key=lambda t: str(t.get("node_id")))

    trees = _call(go)
    if as_json:
        console.print_json(json.dumps(trees))
    elif not trees:
        err_console.print(f"no node of prefix {prefix!r} answered within {wait_s:g} s")
    else:
        from rich.table import Table

        from ._wrap import FittedTable

        columns = ("supervisor", "child", "actors", "pid", "status", "restarts", "last exit")
        for t in trees:
            table = Table()
            for col in columns:
                table.add_column(col, justify="right" if col in ("pid", "restarts") else "left")
            title = (f"node {t.get('node_id')} (pid {t.get('pid')}, up {t.get('uptime_s', 0):.0f} s"
                     + (", stopping" if t.get("stopping") else "") + ")")
            # where the table does not fit (an 80-column terminal), name=value blocks: a supervisor, its children
            fitted = FittedTable(table, title, wrap_cells=True, title_justify="left")
            for sup in t.get("supervisors", []):
                supervisor = (f"{sup['name']} ({sup['state']}, {sup['strategy']}, {sup['intensity']} in "
                              f"{sup['period_s']:g} s)")
                fitted.add_row(supervisor, "", "", "", "", str(sup["restarts"]), "", head=f"supervisor {sup['name']}:",
                               items=[f"state={sup['state']}", f"strategy={sup['strategy']}",
                                      f"intensity={sup['intensity']}", f"period_s={sup['period_s']:g}",
                                      f"restarts={sup['restarts']}"])
                for ch in sup.get("children", []):  # its block: "  child nats: actors=- pid=4711 ..."
                    fitted.add_row("", ch["id"], " ".join(ch.get("actors") or ()) or "-", str(ch["pid"] or "-"),
                                   ch["status"], str(ch["restarts"]), ch["last_exit"] or "-",
                                   head=f"  child {ch['id']}:", head_cells=2)
            console.print(fitted)
    raise typer.Exit(0 if trees else EXIT_FAILED)


MAX_BENCH_DURATION_S = 86_400.0
"""Longest ``bench --duration`` (one step), seconds: a day."""
MAX_BENCH_TIMEOUT_S = 3_600.0
"""Longest ``bench --timeout-s`` (one request's budget), seconds."""


def max_bench_gens() -> int:
    """Most ``bench --gens`` on this host: 4 per core, at least 8 (1,000 generator processes on a 2-core box ran
    the load average to 67 and did not finish a 1 s step within a minute: a fresh-user trial, 2026-12-02)."""
    return max(8, 4 * (os.cpu_count() or 1))


MAX_BENCH_CONCURRENCY = 1_000_000
"""Most callers of one closed-loop step (``bench --concurrency``)."""
MAX_BENCH_RATE = 10_000_000.0
"""Highest ``bench --rate``, requests/s (``inf`` was a traceback; a rate the generators cannot reach stops at
twice the step's duration with the rest counted NOT_SENT, :meth:`inferbus.loadgen._lean.LeanDriver.open`)."""


def _bench_list(text: str, opt: str, kind, lo: float, hi: float, what: str, unit: str = "") -> list:
    """``bench``'s comma-separated ``--concurrency`` / ``--rate``: each item a finite ``kind`` in range (``lo``
    exclusive for rates, inclusive for concurrencies); '' = none. One line naming ``opt`` and the item, exit 2: a
    number out of range as every refusal echoes one (:func:`inferbus._limits.number_as_typed`: ``got 20000000``,
    not ``got '2e7'``), an item that is no number as typed, quoted."""
    import math

    items = text.split(",") if text.strip() else []
    out = []
    for raw in items:
        try:
            v = kind(raw.strip())
        except ValueError:
            try:  # a number that is no integer (--concurrency 2e7, 1.5): as typed, unquoted, as a number is echoed
                shown = raw.strip() if raw.strip() and float(raw) is not None else repr(raw.strip())
            except ValueError:
                shown = repr(raw.strip())
            _usage(f"bench: {opt} takes {what}, comma-separated, got {shown} in {text!r}")
        ok = math.isfinite(v) and (lo <= v if kind is int else lo < v) and v <= hi
        if not ok:
            _usage(f"bench: each {opt} must be in {interval(lo, hi, lo_open=kind is not int)}{unit}, "
                   f"got {number_as_typed(v)}")
        out.append(v)
    return out


def _check_bench_ranges(*, duration_s: float, timeout_s: float, gens: int, ingress: int, workers: int) -> None:
    """Refuse a ``bench`` option out of its range: one line naming the option and the value, exit 2."""
    import math

    for opt, v, hi in (("--duration", duration_s, MAX_BENCH_DURATION_S), ("--timeout-s", timeout_s, MAX_BENCH_TIMEOUT_S)):
        if not (math.isfinite(v) and 0 < v <= hi):
            _usage(f"bench: {opt} must be in {interval(0, hi, lo_open=True)} seconds, got {number_as_typed(v)}")
    node = "processes of one node"
    for opt, v, lo, hi, what in (("--gens", gens, 1, max_bench_gens(), "4 per core on this host, at least 8"),
                                 ("--ingress", ingress, 1, MAX_NODE_PROCESSES, node),
                                 ("--workers", workers, 0, MAX_NODE_PROCESSES, node)):
        if not lo <= v <= hi:
            _usage(f"bench: {opt} must be in {interval(lo, hi)} ({what}), got {v}")


@app.command(short_help="Measure latency and throughput under generated load.")
def bench(
    ctx: typer.Context,
    model: str = typer.Argument("digits", metavar="MODEL"),
    nats_url: Optional[str] = typer.Option(None, help="Bench a running deployment; default: start one here."),
    models: Optional[str] = typer.Option(None, help="Model repository (for inputs and the reference).",
                                         metavar="<path>"),
    version: Optional[str] = typer.Option(None, help="Model version (default: the default version the deployment "
                                                     "serves, from its metadata)."),
    workers: int = typer.Option(0, help=f"Workers of the deployment started here (0 = one per core), in {interval(0, MAX_NODE_PROCESSES)}."),
    ingress: int = typer.Option(1, help=f"Ingress replicas of the deployment started here, in {interval(1, MAX_NODE_PROCESSES)}."),
    busy_poll_us: float = typer.Option(0.0, help="Busy polling of the deployment started here (µs, 0 = off; in "
                                       f"{interval(0, MAX_WINDOW_US)}; see `up`)."),
    gens: int = typer.Option(1, help=f"Load-generator processes, in {interval(1, max_bench_gens())} (4 per core of this host, at least 8)."),
    concurrency: str = typer.Option("1,8,64", help="Closed-loop concurrencies, comma-separated ('' = none)."),
    rate: str = typer.Option("", help="Open-loop rates in requests/s, comma-separated."),
    duration_s: float = typer.Option(5.0, "--duration", help=f"Seconds per step, in "
                                     f"{interval(0, MAX_BENCH_DURATION_S, lo_open=True)}."),
    hit: bool = typer.Option(False, help="Repeat one input (cache hits) instead of distinct inputs."),
    timeout_s: float = typer.Option(1.0, help=f"Per-request budget in seconds, in {interval(0, MAX_BENCH_TIMEOUT_S, lo_open=True)}."),
    prefix: str = typer.Option("inferbus", help="Subject prefix of the deployment (`up --prefix`)."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON."),
    spread: bool = typer.Option(False, help="Generator k connects to server k mod n of --nats-url first (load "
                                "spread over gateway-joined servers, as --spread-servers places a node)."),
    suite: bool = typer.Option(False, "--suite", help="Run the benchmark suite of ./bench (floors, peer, ratios, plot)."),
    profile: str = typer.Option("quick", help="With --suite: tiny, quick, full or throughput."),
    out: Optional[Path] = typer.Option(None, help="With --suite: write the JSON here (and the PNG next to it)."),
):
    """Closed-loop (concurrency) and open-loop (fixed rate) load from generator processes, HDR percentiles,
    every answer checked; --suite runs the whole benchmark suite (docs/performance.md). Each request is sent
    once (no retries, unlike the SDK): an error during a failover is counted, not hidden."""
    from ._cli_bench import run_load, run_suite

    from .bus._busypoll import check_busy_poll_us

    try:
        check_busy_poll_us(busy_poll_us, "bench: --busy-poll-us")
    except ValueError as exc:
        _usage(str(exc))
    _check_prefix(prefix)
    if version is not None:  # as the SDK and the ingress say it ('01', 'v1', '' were "not in the model repository")
        from .bus._subjects import version_problem

        if (problem := version_problem(version)) is not None:
            _usage(f"bench: --version {version!r}: {problem}")
    models = _folder_option("bench", "--models", models)  # '' was the current folder, as for up's --models
    if suite:
        try:  # the suite's own profiles (its argparse said "--profile: invalid choice: 'huge' (choose from ...)")
            from bench.suite import PROFILES
        except ImportError:  # no checkout here: run_suite says so
            PROFILES = None
        if PROFILES is not None and profile not in PROFILES:
            _usage(f"bench: --profile must be one of {', '.join(sorted(PROFILES))}, got {profile!r}")
        args = _suite_args(ctx, profile, out, busy_poll_us, model, version, models, workers, ingress, gens,
                           duration_s, timeout_s)
        # the ranges of a load run (--duration 1e9 was handed to the suite and run)
        _check_bench_ranges(duration_s=duration_s, timeout_s=timeout_s, gens=gens, ingress=ingress, workers=workers)
        raise typer.Exit(run_suite(args))
    only_suite = [o for n, o in (("profile", "--profile"), ("out", "--out")) if _given(ctx, n)]
    if only_suite:  # ignored without a word before (a fresh-user trial: --out wrote nothing, exit 0)
        _usage(f"bench: {' and '.join(only_suite)} appl{'y' if len(only_suite) > 1 else 'ies'} only with --suite "
               f"(a load run prints its results; --json prints them as JSON)")
    levels = _bench_list(concurrency, "--concurrency", int, 1, MAX_BENCH_CONCURRENCY, "integers")
    rates = _bench_list(rate, "--rate", float, 0, MAX_BENCH_RATE, "numbers of requests/s", " requests/s")
    if not levels and not rates:
        _usage("bench: nothing to run (give --concurrency and/or --rate)")
    _check_bench_ranges(duration_s=duration_s, timeout_s=timeout_s, gens=gens, ingress=ingress, workers=workers)
    if spread and nats_url is None:  # ignored without a word before (a fresh-user trial)
        _usage("bench: --spread spreads the generators over the servers of --nats-url; without --nats-url there is "
               "one server (the deployment bench starts)")
    if nats_url is not None:  # they shape the deployment bench starts itself: ignored without a word before
        _nats_urls_given("bench", nats_url)
        own = [o for n, o in (("workers", "--workers"), ("ingress", "--ingress"), ("busy_poll_us", "--busy-poll-us"))
               if _given(ctx, n)]
        if own:
            _usage(f"bench: {' and '.join(own)} shape{'' if len(own) > 1 else 's'} the deployment bench starts "
                   f"itself, not the one at --nats-url; leave {'them' if len(own) > 1 else 'it'} out or drop --nats-url")
    models_dir = _models_dir(models)
    if not Path(models_dir).is_dir():  # (a traceback before, a trial; the model's inputs are read from there)
        _usage(f"bench: the model repository {models_dir} is not a folder (--models)")
    kw = dict(model=model, version=version, models_dir=models_dir, nats_url=nats_url,
              workers=workers, ingress=ingress, busy_poll_us=busy_poll_us, gens=gens, concurrency=levels, rates=rates,
              duration_s=duration_s, hit=hit, timeout_s=timeout_s, prefix=prefix, spread=spread)
    from .actors._repository import RepositoryError

    try:
        results = _call(lambda: run_load(**kw), as_json=json_out)
    except RepositoryError as exc:  # the model's own folder cannot be read (its config, its model.onnx)
        _usage(f"bench: the model repository cannot be served: {' '.join(str(exc).split())}")
    if json_out:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        from .loadgen import render_table

        console.print(render_table(results, f"inferbus bench — {model}"))
    # wrong answers, or errors other than overload signals (a step past saturation times out or is shed:
    # that is a measurement, not a failure), make the exit status 1; so does a step in which not one request was
    # answered at all (every one TIMEOUT): a deployment past saturation still answers or sheds some, one that
    # answers nothing has stopped or hung (a fresh-user trial: a node stopped during a closed-loop run, 32 of 32
    # timed out, exit 0)
    from .loadgen._result import load_label

    silent = [r for r in results if r.requests > 0 and r.errors.get("TIMEOUT", 0) >= r.requests]
    refused_light = _refused_at_lightest(results)
    failed = [r for r in results if r.wrong or set(r.errors) - _OVERLOAD_CODES or r in silent
              or any(r is x for x, _ in refused_light)]
    if silent:
        steps = ", ".join(f"{r.mode} {load_label(r)}" for r in silent)
        print(f"bench: {len(silent)} step(s) got no answer at all ({steps}: every "
              f"request timed out after --timeout-s {timeout_s:g} s): the deployment answered nothing within it",
              file=sys.stderr, flush=True)
    for r, n in refused_light:
        codes = ", ".join(f"{c} {r.errors[c]}" for c in sorted(_OVERLOAD_CODES) if r.errors.get(c))
        print(f"bench: {r.mode} {load_label(r)}, the lightest load of its loop, had {n} of {r.requests} requests "
              f"refused or late ({codes}): that is not saturation (a rate limit, a shedding or too slow deployment?)",
              file=sys.stderr, flush=True)
    if failed:  # on stderr with --json (stdout is the JSON): a failing run said nothing there (a fresh-user trial)
        said = (f"{len(failed)} step(s) with wrong answers, errors other than {'/'.join(sorted(_OVERLOAD_CODES))}, no "
                f"answer at all, or refusals at the lightest load")
        if json_out:
            print(f"bench: {said} (the JSON's steps say which: wrong, errors)", file=sys.stderr, flush=True)
        else:
            console.print(f"[red]{said} (the lines above say which)[/red]")
    raise typer.Exit(1 if failed else 0)


_OVERLOAD_CODES = frozenset({"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "TIMEOUT"})
_LIGHTEST_OVERLOAD_SHARE = 0.01
"""The share of overload codes (:data:`_OVERLOAD_CODES`) at the lightest step of a loop that fails a bench run."""


def _refused_at_lightest(results: list) -> list[tuple]:
    """The steps that are the lightest of their loop (per target, model and mode: a closed loop's lowest concurrency,
    an open loop's lowest rate when the run has more than one rate; a single rate may be chosen past saturation on
    purpose) and had more than :data:`_LIGHTEST_OVERLOAD_SHARE` of their requests refused or late, each as ``(step,
    requests refused or late)``. Past saturation
    those codes are the measurement; at the lightest load they are not: a node shedding everything (a rate limit of
    5/s) passed with exit 0, 5,156 of 5,168 requests RESOURCE_EXHAUSTED at c=1 (a fresh-user trial)."""
    loops: dict[tuple, list] = {}
    for r in results:
        load = r.concurrency if r.mode.startswith("closed") else r.rate_qps
        if load is not None:
            loops.setdefault((r.target, r.model, r.mode), []).append((load, r))
    out = []
    for (_, _, mode), steps in loops.items():
        if not mode.startswith("closed") and len(steps) < 2:
            continue
        r = min(steps, key=lambda lr: lr[0])[1]
        n = sum(r.errors.get(c, 0) for c in _OVERLOAD_CODES)
        if r.requests and n > _LIGHTEST_OVERLOAD_SHARE * r.requests:
            out.append((r, n))
    return out

# bench's options that `bench --suite` hands to `python -m bench.suite`: (parameter, its flag there)
_SUITE_PASSED = (("model", "--model"), ("version", "--version"), ("models", "--models-dir"), ("workers", "--workers"),
                 ("ingress", "--ingress"), ("gens", "--gens"), ("duration_s", "--duration"),
                 ("timeout_s", "--timeout"))
# and those of a load run that the suite has no use for: (parameter, bench's flag)
_NOT_FOR_SUITE = (("nats_url", "--nats-url"), ("concurrency", "--concurrency"), ("rate", "--rate"), ("hit", "--hit"),
                  ("prefix", "--prefix"), ("json_out", "--json"), ("spread", "--spread"))


def _suite_args(ctx: typer.Context, profile: str, out: Optional[Path], busy_poll_us: float, *values) -> list[str]:
    """The argv of ``python -m bench.suite`` for ``bench --suite``: ``--profile``, ``--out`` as ``--json``,
    ``--busy-poll-us``, and each of :data:`_SUITE_PASSED` that was given (``values`` in that order).

    Raises:
        typer.Exit: (2, one line) an option of a load run that the suite does not take (it starts its own
            deployment, sweeps its own loads and writes JSON with ``--out``), or ``--workers 0``.
    """
    unused = [flag for name, flag in _NOT_FOR_SUITE if _given(ctx, name)]
    if unused:  # ignored without a word before (a fresh-user trial: the suite started its own deployment)
        _usage(f"bench: --suite does not take {', '.join(unused)}: the suite starts its own deployment and sweeps its "
               f"own loads (see python -m bench.suite --help for its options; --out FILE writes its JSON)")
    args = ["--profile", profile] + (["--json", str(out)] if out else [])
    args += ["--busy-poll-us", str(busy_poll_us)] if busy_poll_us else []
    for (name, flag), value in zip(_SUITE_PASSED, values):
        if not _given(ctx, name):
            continue
        if name == "workers" and value == 0:
            _usage("bench: --suite takes --workers 1 or more (left out: the profile's number)")
        args += [flag, str(value)]
    return args


try:  # (after app: they import it) a Ctrl-C while they load exits 130 quietly, as above
    from ._cli_chaos import app as _chaos_app  # noqa: E402
    from ._cli_cluster import app as _cluster_app  # noqa: E402
    from ._cli_region import app as _region_app  # noqa: E402
    from ._cli_devices import devices as _devices_cmd  # noqa: E402
    from ._cli_models import app as _models_app  # noqa: E402
except KeyboardInterrupt:
    raise SystemExit(128 + signal.SIGINT) from None

app.add_typer(_chaos_app, name="chaos")
app.add_typer(_cluster_app, name="cluster")
app.add_typer(_region_app, name="region")
app.add_typer(_models_app, name="models")
app.command(name="devices", short_help="List the accelerators found here and the worker plan.")(_devices_cmd)


def _type_refusal(exc: BaseException) -> Optional[str]:
    """A value of the wrong type for a number option (``--workers x``, ``--workers 1.5``, ``--timeout-s 0x10``) in the
    words of every refusal: ``--workers must be an integer, got 1.5``, the option as typed (``--timeout`` or
    ``--timeout-s``), a number as typed, unquoted, anything else quoted (``got 'x'``). Typer 0.29 parses option
    values with pydantic and said its words, ``Invalid value for '--workers': Input should be a valid integer,
    unable to parse string as an integer``. None for any other error (Click's own words are kept)."""
    cause = exc.__cause__
    param = getattr(exc, "param", None)
    errors = getattr(cause, "errors", None)
    if param is None or not callable(errors) or type(cause).__name__ != "ValidationError":
        return None
    try:
        first = errors()[0]
    except (IndexError, TypeError):
        return None
    kind = str(first.get("type", ""))
    want = "an integer" if kind.startswith("int_") else "a number" if kind.startswith("float_") else None
    if want is None:
        return None
    names = [n for n in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())) if n.startswith("-")]
    typed = [a.split("=", 1)[0] for a in sys.argv[1:] if a.split("=", 1)[0] in names]
    name = typed[-1] if typed else names[0] if names else str(param.human_readable_name)
    raw = first.get("input")
    try:
        shown = raw if isinstance(raw, str) and raw == raw.strip() and float(raw) is not None else repr(raw)
    except ValueError:
        shown = repr(raw)
    return f"{name} must be {want}, got {shown}"


def _command_words(argv: list[str]) -> str:
    """The (sub)command ``argv`` names, e.g. ``"chaos run"`` for ``chaos run worker-crash --rate``: the leading
    words that are command names of the app's groups."""
    cmd = typer.main.get_command(app)
    words = []
    for tok in argv:
        sub = getattr(cmd, "commands", {}).get(tok)
        if sub is None:
            break
        words.append(tok)
        cmd = sub
    return " ".join(words)


_HELP_WORDS = ("-h", "--help", "help")
"""What asks for help before a command's name: ``inferbus -h up``, ``inferbus --help up``, ``inferbus help up``."""


def _help_of_a_command(argv: list[str]) -> list[str]:
    """``argv`` with a request for help that comes before the command's words moved after them: ``-h up`` (or
    ``--help up``, ``help up``, ``help models load``) becomes ``up --help``, so that it prints ``up``'s help. Click
    handles the root group's ``-h`` as soon as it meets it, before it looks at the command that follows, and printed
    the root help. ``help`` alone is ``--help`` (the root help); ``help`` before a word that is no command is
    ``<word> --help``, refused as any unknown command is (``No such command``). Anything else is ``argv`` as given."""
    if not argv or argv[0] not in _HELP_WORDS:
        return argv
    rest = argv[1:]
    if argv[0] == "help":
        return [*rest, "--help"]
    return [*rest, "--help"] if _command_words(rest) else argv


def main() -> None:
    """The ``inferbus`` command (:func:`_run_app`). Its stdout or stderr found a closed pipe (``inferbus infer ... |
    head -c1``): the command ends quietly, no traceback, exit 141 (128 + SIGPIPE, as a shell reports ``yes | head
    -1``'s ``yes``); ``up`` first stops its node as on SIGTERM (see :class:`_Output`), and exits 141 where it would
    have exited 0, its own status otherwise (a second signal, a failure). A write that fails otherwise (``>
    /dev/full``): on stdout, one line on stderr and exit 1; on stderr, the command's own exit status, a 0 made 1
    (:meth:`_Output._failed`). Started with stdin, stdout or stderr closed (``>&-``), that descriptor is opened on
    /dev/null first: else the first socket took its number, and uvloop aborts on closing a descriptor below 3 (``uv__close: Assertion `fd > STDERR_FILENO' failed``)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: hold the number with /dev/null so no socket or file gets it
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is not None:  # (None: started with its descriptor closed; print() and rich then write nothing)
        sys.stdout = _Output(sys.stdout, "stdout")
    if sys.stderr is not None:
        sys.stderr = _Output(sys.stderr, "stderr")
    code = 0
    try:
        try:
            _run_app()
        except SystemExit as exc:
            code = exc.code
        for stream in (sys.stdout, sys.stderr):  # text still buffered: a closed pipe shows only now
            if stream is not None:
                stream.flush()
    except BrokenPipeError:
        if not _ClosedOutput.raised:  # not ours (e.g. a socket's): what it was before
            raise
    except _OutputFailed:  # stdout: recorded in _OutputFailed.seen, said below
        pass
    failed = _OutputFailed.seen.get("stdout")
    if failed is not None:
        try:
            print(f"error: cannot write the output (stdout): {failed.strerror or failed}", file=sys.__stderr__,
                  flush=True)
        except OSError:
            pass
        sys.exit(EXIT_FAILED)
    if _ClosedOutput.raised or (_ClosedOutput.closed and code in (0, None)):
        code = EXIT_CLOSED_OUTPUT
    if "stderr" in _OutputFailed.seen and code in (0, None):  # done, but what it said on stderr is lost
        code = EXIT_FAILED
    sys.exit(code)


def _http_address(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets: RFC 3986)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _oip_line(address: str, http_infer: bool, http_model_control: bool = False) -> str:
    """The banner's line of a node's OIP v2 REST API at ``address`` (``host:port``), as ``up`` and ``cluster up``
    print it (tests and scripts grep it)."""
    infer = "infer" if http_infer else "infer off: --http-infer"
    control = "model control" if http_model_control else "model control off: --http-model-control"
    return f"OIP v2 REST http://{address}/v2 (health, metadata, statistics, {infer}, {control})"


def _open_inference_note(address: str, http_infer: bool = True, http_model_control: bool = False) -> str:
    """The note of ``--http-infer`` or ``--http-model-control`` on an address other than loopback (``host:port``
    ``address``)."""
    what = " and ".join([*(["inference"] if http_infer else []), *(["model load/unload"] if http_model_control
                                                                   else [])])
    flags = ", ".join([*(["--http-infer"] if http_infer else []), *(["--http-model-control"] if http_model_control
                                                                    else [])])
    return (f"{what} over HTTP is open to whoever reaches {address}, without authentication ({flags}); "
            "--http-host 127.0.0.1 keeps it on this host (docs/http.md)")


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this host only: ``127.0.0.0/8``, ``::1``, ``localhost``."""
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _typed_name(alias: str, name: str) -> str:
    """``alias`` when the command line has it (``--http-port 8000``, ``--http-port=8000``), else ``name``: the one of
    an option's two names that a refusal of it repeats."""
    return alias if any(a == alias or a.startswith(alias + "=") for a in sys.argv[1:]) else name


def _option_value(argv: list[str], name: str) -> Optional[str]:
    """The last value ``argv`` gives option ``name`` (``--name value`` or ``--name=value``), None where none."""
    value = None
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(name + "="):
            value = tok[len(name) + 1:]
    return value


def _json_lines_actor(command: str, argv: list[str]) -> Optional[str]:
    """The ``actor`` of ``up``'s JSON Lines (``node-<--node-id>``, default ``node-n1``) where ``argv`` asks ``up``
    for ``--log-format json``; None for any other command or format. A refusal of the option parser (an unknown
    option, a value of the wrong type) comes before ``up`` reads its options, and was a text line in json mode (a
    fresh-user trial); :func:`_run_app` writes it as a record with this."""
    if command != "up" or _option_value(argv, "--log-format") != "json":
        return None
    return f"node-{_option_value(argv, '--node-id') or 'n1'}"


def _run_app() -> None:
    """The ``inferbus`` command's app (:func:`main` runs it). A usage error that the argument parser finds (an
    option value of the wrong type, a missing argument, an unknown option or command) is one line on stderr,
    ``error: <command>: <message> (see <command path> --help)``, exit 2, like the commands' own checks; Typer's
    default is a framed box of several lines (a fresh-user trial). A Ctrl-C that reaches Python (a command without
    its own handler, or while modules load: this module's imports turn it into exit 130 too) exits 130 with no
    traceback, as a shell reports a SIGINT death. Everything else (help, exit statuses, tracebacks of bugs) is
    Typer's."""
    sys.argv[1:] = _help_of_a_command(sys.argv[1:])
    try:
        rv = app(standalone_mode=False)
    except KeyboardInterrupt:  # Typer 0.29 makes it Exit(130) itself; this is for one that escaped it
        sys.exit(128 + signal.SIGINT)
    except typer.TyperException as exc:  # the base of Typer's (vendored Click's) usage and file errors
        ctx = getattr(exc, "ctx", None)
        if exc.exit_code == 2 and type(exc).__name__ != "NoArgsIsHelpError":
            if ctx is not None:
                path = ctx.command_path  # "inferbus up", or "python -m inferbus.cli up"
                sub = path[len(ctx.find_root().command_path):].strip()
            else:  # the option parser's own errors carry no context ("Option '--workers' requires an argument.")
                sub = _command_words(sys.argv[1:])
                path = f"inferbus {sub}".strip()
            message = _type_refusal(exc) or " ".join(exc.format_message().split())
            if message.startswith("Invalid value: --"):  # a check of ours that names its option (infer's --input):
                message = message[len("Invalid value: "):]  # in the words of every other refusal, no Click prefix
            line = f"error: {sub or 'inferbus'}: {message} (see {path} --help)"
            actor = _json_lines_actor(sub, sys.argv[1:])
            if actor is not None:  # up --log-format json: its parser's refusals are records too
                JsonLinesConsole(True, actor).print(line, markup=False)
            else:
                print(line, file=sys.stderr)
        else:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)  # what Typer prints (nothing for a bare group: it printed the help)
        sys.exit(exc.exit_code)
    except typer.Abort as exc:
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):  # older Typer: Ctrl-C became Abort
            sys.exit(128 + signal.SIGINT)
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if signal.getsignal(signal.SIGINT) is _sigint_while_loading:  # loaded: a Ctrl-C is a KeyboardInterrupt again
    signal.signal(signal.SIGINT, signal.default_int_handler)
