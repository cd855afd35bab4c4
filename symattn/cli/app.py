"""The ``symattn`` command group and its console script: exit codes, signals, and no traceback.

Heavy imports (SymPy, NumPy) happen inside the commands, so ``symattn --help``
starts fast.
"""

from __future__ import annotations

import os
import sys

import click

from .check import check
from .derive import derive
from .generate import generate

VERSION = "0.1.0"  # kept equal to symattn.__version__ by a test


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="symattn")
@click.option("--debug", is_flag=True, hidden=True, help="Show the traceback of an internal error.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Work out transformer attention exactly, stage by stage.

    softmax(Q Kᵀ / √d_k + M) V with exact numbers (fractions, square roots,
    e^… terms, −∞ for masked positions), a worked solution in LaTeX,
    Markdown, text or JSON, and a numeric cross-check of every stage.
    """
    ctx.obj = {"debug": debug}


for _command in (derive, check, generate):
    cli.add_command(_command)


class _Terminated(BaseException):
    """SIGTERM arrived: unwind as Ctrl-C does, so temporary files are removed."""


# Python runs a signal's handler between two bytecodes of the main thread, and the exception it
# raises can still be lost: raised inside a finaliser (``Exception ignored in ...``) or caught by a
# library's bare ``except:``. So the first SIGTERM also starts a timer of CPU time (SIGPROF every
# 0.1 CPU second) that raises it again until the process unwinds; CPU time, not a clock, so a busy
# machine changes nothing. The frames that unwind (``main``, ``_stopped``) are never interrupted.
_RAISE_AGAIN_CPU_S = 0.1
_unwinding = False


def _on_sigterm(signum, frame) -> None:
    import signal

    if _unwinding or frame is not None and frame.f_code in (main.__code__, _stopped.__code__):
        return
    if signum == signal.SIGTERM and hasattr(signal, "setitimer"):
        signal.signal(signal.SIGPROF, _on_sigterm)
        signal.setitimer(signal.ITIMER_PROF, _RAISE_AGAIN_CPU_S, _RAISE_AGAIN_CPU_S)
    raise _Terminated()


def _stopped() -> int:
    """The end of a run that SIGTERM stopped: the timer disarmed, temporary files removed, one line."""
    global _unwinding
    import signal

    from .. import writing as _output

    _unwinding = True
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_PROF, 0)
    _output.cleanup()
    _output.silence_stdout()
    click.echo("Error: stopped by SIGTERM; no output file was left half-written", err=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    """The console script: click's exit codes, and no traceback for a bug either."""
    import signal

    from .. import writing as _output

    args = sys.argv[1:] if argv is None else argv
    # NumPy here only cross-checks (matrices of n×d_k and n×n): one BLAS thread does that in
    # well under a millisecond a product, while a thread pool on a busy machine costs 10-100×
    # more. Read when NumPy is first imported; a user's own setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    global _unwinding
    _unwinding = False
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        code = run_command(args)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _output.silence_stdout()
            return 1
        except OSError as exc:
            _output.silence_stdout()
            click.echo(f"Error: cannot write to standard output: {exc.strerror or exc}", err=True)
            return 1
        return code
    except _Terminated:
        return _stopped()
    finally:
        _output.cleanup()
        if previous is not None:
            if hasattr(signal, "setitimer"):
                signal.setitimer(signal.ITIMER_PROF, 0)  # a SIGTERM's timer, if one came
            signal.signal(signal.SIGTERM, previous)
        if argv is None:
            # The console script's process ends here. Interpreter shutdown would run full
            # collections over every object SymPy and a derivation built (a fifth of the 4-token
            # demo's time) only to hand the memory back to the OS; frozen, they are skipped.
            # Output is flushed and temporary files are gone by now, and atexit handlers still run.
            import gc

            gc.freeze()


def run_command(args: list[str]) -> int:
    """The command line ``args`` run by click, as an exit code: every error one line (3: a bug)."""
    from .. import writing as _output

    debug = "--debug" in args
    if hasattr(sys, "set_int_max_str_digits"):
        # Exact results are printed in full: a sum of fractions can outgrow Python's 4,300-digit
        # guard, while every input is bounded before any arithmetic (see symattn.numbers.parse).
        sys.set_int_max_str_digits(0)
    try:
        code = cli.main(args=args, prog_name="symattn", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 1
    except _output.StdoutError as exc:
        _output.silence_stdout()
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:
        _output.silence_stdout()
        return 1
    except KeyboardInterrupt:
        return 1
    except Exception as exc:  # an internal error: a short message, never a traceback
        if debug:
            raise
        click.echo(
            f"Error: internal error ({type(exc).__name__}: {exc}). This is a bug in symattn {VERSION}; "
            "please report it with the problem file (run with --debug for the traceback).",
            err=True,
        )
        return 3
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
