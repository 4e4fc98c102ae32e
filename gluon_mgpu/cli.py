"""What every ``python -m gluon_mgpu.*`` command shares: bad input as one line.

A ``UsageError``'s message is the whole line shown on stderr (exit code 2); ``_Parser`` turns
argparse's own errors into one, naming the program and pointing to ``--help``.
"""
import argparse

__all__ = ['UsageError', 'add_device_flag']


class UsageError(Exception):
    """Bad command-line input; the message is the whole line shown to the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError('%s: error: %s (see --help)' % (self.prog, message))


def add_device_flag(parser):
    """Add ``--device auto|gpu|cpu``, as ``get_devices`` reads it."""
    from .devices import DEVICE_CHOICES
    parser.add_argument('--device', choices=DEVICE_CHOICES, default='auto',
                        help='auto: GPUs if there are enough, simulated CPU devices if there is '
                             'no GPU; gpu: GPUs or an error; cpu: CPU contexts (default: auto)')
