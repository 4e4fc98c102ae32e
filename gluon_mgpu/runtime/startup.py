"""The first seconds of a ``python -m gluon_mgpu.<command>``: a signal while the package imports
MXNet ends the command with one line, not a traceback (docs/outputs.md, "When a command fails").
"""
import os
import signal
import sys

from .gpu_build import command_module

__all__ = ['starting_command', 'guard', 'release']

_SIGNALS = {signal.SIGINT: ('interrupted (Ctrl-C)', signal.default_int_handler),
            signal.SIGTERM: ('terminated (SIGTERM)', signal.SIG_DFL),
            signal.SIGHUP: ('terminated (SIGHUP)', signal.SIG_DFL)}
_TAKEN = {}


def starting_command(argv=None, orig_argv=None):
    """``'python -m gluon_mgpu.train'`` while ``python -m`` imports the package for a command,
    else None. (runpy imports the package before it sets ``sys.argv[0]``, which is ``-m`` then.)"""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, 'orig_argv', []) if orig_argv is None else orig_argv
    module = command_module(orig_argv) if argv[:1] == ['-m'] and orig_argv else None
    return 'python -m %s' % module if module and module.split('.')[0] == 'gluon_mgpu' else None


def guard():
    """While a command starts, make SIGINT, SIGTERM and SIGHUP end it with one line."""
    command = starting_command()
    if command is None:
        return

    def stop(signum, frame):
        try:
            os.write(2, ('%s: %s while starting; nothing was done\n'
                         % (command, _SIGNALS[signum][0])).encode())
        except OSError:  # SIGHUP: the terminal may be gone
            pass
        os._exit(128 + signum)

    for signum, (_, default) in _SIGNALS.items():
        if signal.getsignal(signum) is default:
            _TAKEN[signum] = signal.signal(signum, stop)


def release():
    """Give the signals back their handlers: the command handles them from here on."""
    for signum, previous in _TAKEN.items():
        signal.signal(signum, previous)
    _TAKEN.clear()
