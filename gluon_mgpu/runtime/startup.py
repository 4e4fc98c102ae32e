"""The first seconds of a ``python -m gluon_mgpu.<command>``: a signal while the package imports
MXNet ends the command with one line, not a traceback (docs/outputs.md, "When a command fails");
and ``interruptible``, for any wait inside MXNet's C++ code, where Python runs no handler.
"""
import contextlib
import os
import signal
import sys
import threading

from .gpu_build import command_module

__all__ = ['starting_command', 'guard', 'release', 'interruptible', 'join_job']

_SIGNALS = {signal.SIGINT: ('interrupted (Ctrl-C)', signal.default_int_handler),
            signal.SIGTERM: ('terminated (SIGTERM)', signal.SIG_DFL),
            signal.SIGHUP: ('terminated (SIGHUP)', signal.SIG_DFL)}
_TAKEN = {}
_ARMED = []
# How long the main thread has to handle a signal itself before the watcher ends the process.
LATE_SECONDS = 1.0


def starting_command(argv=None, orig_argv=None):
    """``'python -m gluon_mgpu.train'`` while ``python -m`` imports the package for a command,
    else None. (runpy imports the package before it sets ``sys.argv[0]``, which is ``-m`` then.)"""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, 'orig_argv', []) if orig_argv is None else orig_argv
    module = command_module(orig_argv) if argv[:1] == ['-m'] and orig_argv else None
    return 'python -m %s' % module if module and module.split('.')[0] == 'gluon_mgpu' else None


def _lines(command, doing):
    return {signum: ('%s: %s %s\n' % (command, what, doing)).encode()
            for signum, (what, _) in _SIGNALS.items()}


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (a closed or broken stream: the line still goes out)
            pass


def _end(line, signum, flush_seconds=None):
    """Write ``line`` on stderr and end the process as stopped by ``signum`` (128 + it), after
    flushing what the command printed (from another thread, within ``flush_seconds``: the main
    thread may hold a stream's lock, stuck writing to a pipe nobody reads)."""
    if flush_seconds is None:
        _flush()
    else:
        flusher = threading.Thread(target=_flush, daemon=True)
        flusher.start()
        flusher.join(flush_seconds)
    try:
        os.write(2, line)
    except OSError:  # SIGHUP: the terminal may be gone
        pass
    os._exit(128 + signum)


def _arm(lines):
    """Start a thread that ends the process with ``lines[signum]`` when one of ``_SIGNALS``
    arrives and the main thread, stuck in C code, has not handled it within LATE_SECONDS.
    Python's C-level handler writes every signal's number to the wakeup fd at once, whatever
    the main thread does; a signal without a Python handler (SIG_DFL) gets one that ends the
    process the same way. Returns what ``_disarm`` needs."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    taken = {}
    for signum in _SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            taken[signum] = signal.signal(
                signum, lambda n, frame: _end(lines[n], n))
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done = threading.Event()

    def watch():
        while True:
            try:
                data = os.read(read, 1)
            except OSError:
                return
            if not data or done.is_set():
                return
            if data[0] in lines and not done.wait(LATE_SECONDS):
                _end(lines[data[0]], data[0], flush_seconds=0.5)

    thread = threading.Thread(target=watch, name='gluon_mgpu-signals', daemon=True)
    thread.start()
    return read, write, previous, taken, done, thread


def _disarm(armed):
    read, write, previous, taken, done, thread = armed
    done.set()
    signal.set_wakeup_fd(previous)
    for signum, handler in taken.items():
        signal.signal(signum, handler)
    os.close(write)  # the watcher reads the end of the pipe and returns
    thread.join(5)
    os.close(read)


@contextlib.contextmanager
def interruptible(command, doing):
    """Inside, SIGINT, SIGTERM and SIGHUP end the process with ``'<command>: interrupted
    (Ctrl-C) <doing>'`` on stderr and exit code 128 + the signal, even while the main thread
    waits inside MXNet (joining a dist job, a server's loop), where Python never runs its
    handlers. A signal the main thread handles itself within a second (its handler raised and
    left the block) is left to it. Outside the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = _arm(_lines(command, doing))
    try:
        yield
    finally:
        _disarm(armed)


def _starting():
    """What a command does while it imports MXNet: starting, or, for a dist job's server or
    scheduler (MXNet's import runs it until the job ends), serving the job."""
    role = os.environ.get('DMLC_ROLE')
    if role in ('server', 'scheduler'):
        return 'while running as the %s of a dist job (DMLC_ROLE=%s)' % (role, role)
    return 'while starting; nothing was done'


def guard():
    """While a command starts, make SIGINT, SIGTERM and SIGHUP end it with one line, also while
    MXNet's import waits in C code (a dist server's loop)."""
    command = starting_command()
    if command is None:
        return
    lines = _lines(command, _starting())

    def stop(signum, frame):
        _end(lines[signum], signum)

    for signum, (_, default) in _SIGNALS.items():
        if signal.getsignal(signum) is default:
            _TAKEN[signum] = signal.signal(signum, stop)
    if threading.current_thread() is threading.main_thread():
        _ARMED.append(_arm(lines))


def release():
    """Give the signals back their handlers: the command handles them from here on."""
    while _ARMED:
        _disarm(_ARMED.pop())
    for signum, previous in _TAKEN.items():
        signal.signal(signum, previous)
    _TAKEN.clear()


def join_job(kvstore, command='gluon_mgpu', root=None):
    """``mx.kv.create(kvstore)`` for a dist kvstore: join the job, which waits for every other
    process of it inside MXNet, where Python sees no Ctrl-C. Here SIGINT, SIGTERM and SIGHUP end
    that wait at once, ``command`` saying so in one line (``interruptible``); ``root`` names
    the job's scheduler in it."""
    import mxnet as mx
    with interruptible(command, 'while waiting for the other processes of the %s job%s; '
                                'nothing was trained'
                       % (kvstore, ' (its scheduler at %s)' % root if root else '')):
        return mx.kv.create(kvstore)
