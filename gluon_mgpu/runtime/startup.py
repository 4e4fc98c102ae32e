"""The first seconds of a ``python -m gluon_mgpu.<command>`` (``before_mxnet``): its threads,
the checks of what MXNet would abort on, the GPU build's libraries, then MXNet, a signal while
it loads ending the command with one line, not a traceback (docs/outputs.md, "When a command
fails"); and ``interruptible``, for any wait inside MXNet's C++ code, where Python runs no
handler.
"""
import contextlib
import os
import signal
import sys
import threading
import time

__all__ = ['Interrupted', 'before_mxnet', 'import_failure', 'prepare_mxnet', 'interruptible',
           'join_job', 'starting']

_SIGNALS = {signal.SIGINT: 'interrupted (Ctrl-C)', signal.SIGTERM: 'terminated (SIGTERM)',
            signal.SIGHUP: 'terminated (SIGHUP)'}
# How long the main thread has to handle a signal itself before the watcher ends the process.
LATE_SECONDS = 1.0
_PREPARED = []  # prepare_mxnet ran


class Interrupted(KeyboardInterrupt):
    """A run or a job stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP: a ``KeyboardInterrupt``
    with its ``signum``, ``signal_name``, ``exit_code`` (128 + ``signum``, as if killed by it)
    and ``words`` (``interrupted (Ctrl-C)``, ``terminated (SIGTERM)``), for every command."""

    def __init__(self, signum=signal.SIGINT):
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        self.exit_code = 128 + self.signum
        self.words = _SIGNALS.get(self.signum, 'terminated (%s)' % self.signal_name)
        super().__init__(self.signal_name)


def _lines(command, doing):
    return {signum: ('%s: %s %s\n' % (command, what, doing)).encode()
            for signum, what in _SIGNALS.items()}


def _flush():
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: the line still goes out
            stream.flush()


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
    with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
        os.write(2, line)
    os._exit(128 + signum)


@contextlib.contextmanager
def _watching(lines):
    """Inside, in the main thread: a watcher thread ends the process with ``lines[signum]``
    when one of ``_SIGNALS`` arrives and the main thread, stuck in C code, has not handled it
    within LATE_SECONDS (the C-level handler writes each signal to the wakeup fd at once); a
    signal left at SIG_DFL gets a handler that ends it the same way. Yields the signals seen
    (None outside the main thread, where nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    taken = {}
    for signum in _SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            taken[signum] = signal.signal(signum, lambda n, frame: _end(lines[n], n))
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    done, seen = threading.Event(), []

    def watch():
        while True:
            try:
                data = os.read(read, 1)
            except OSError:
                return
            if not data or done.is_set():
                return
            if data[0] in lines:
                seen.append(data[0])
                if not done.wait(LATE_SECONDS):
                    _end(lines[data[0]], data[0], flush_seconds=0.5)

    thread = threading.Thread(target=watch, name='gluon_mgpu-signals', daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        for signum, handler in taken.items():
            signal.signal(signum, handler)
        os.close(write)  # the watcher reads the end of the pipe and returns
        thread.join(5)
        os.close(read)


def interruptible(command, doing):
    """Inside, SIGINT, SIGTERM and SIGHUP end the process with ``'<command>: interrupted
    (Ctrl-C) <doing>'`` on stderr and exit code 128 + the signal, even while the main thread
    waits inside MXNet (joining a dist job, a server's loop), where Python never runs its
    handlers. A signal the main thread handles itself within a second (its handler raised and
    left the block) is left to it. Outside the main thread, nothing changes."""
    return _watching(_lines(command, doing))


@contextlib.contextmanager
def starting(command):
    """Inside, until a command's own handling of signals begins (its imports, ``before_mxnet``),
    SIGINT, SIGTERM and SIGHUP end it with ``'<command>: interrupted (Ctrl-C) while starting;
    nothing was done'`` on stderr and exit code 128 + the signal, never a traceback. A dist
    job's server or scheduler, whose import of MXNet serves the job, says so instead."""
    role = os.environ.get('DMLC_ROLE')
    lines = _lines(command, 'while running as the %s of a dist job (DMLC_ROLE=%s)' % (role, role)
                   if role in ('server', 'scheduler') else 'while starting; nothing was done')
    with _watching(lines) as seen:
        try:
            yield
        except BaseException as e:
            if seen is None:
                raise
            # A signal may surface as another error: numpy's import turns the KeyboardInterrupt
            # raised inside it into an ImportError. The watcher notes each signal at once.
            if not seen and not isinstance(e, KeyboardInterrupt):
                time.sleep(0.05)  # time for the watcher to read a signal that just came
            if isinstance(e, KeyboardInterrupt) or seen:
                signum = seen[0] if seen else signal.SIGINT
                _end(lines[signum], signum)
            if isinstance(e, ImportError) and e.name in ('mxnet', 'numpy'):  # a command's module
                sys.stderr.write('%s: error: %s\n' % (command, import_failure(e)))
                raise SystemExit(2) from None
            raise


def prepare_mxnet():
    """What must come before MXNet starts, once per process (``before_mxnet``, or the package's
    hook on ``import mxnet``): ``GLUON_MGPU_CPU_DEVICES`` read, the variables MXNet would abort
    on (``mxnet_env``), numpy 1's names MXNet reads (``numpy_compat``), the GPU build's
    libraries (``gpu_build.prepare``); raises ValueError or
    ``gpu_build.GPUBuildError`` (one line each, naming the value and the fix)."""
    if _PREPARED:
        return
    from . import gpu_build, mxnet_env, numpy_compat, threads
    threads.devices_from_environment(os.environ)
    mxnet_env.check_environment(os.environ, threads.usable_cores())
    numpy_compat.restore()
    gpu_build.prepare()
    _PREPARED.append(True)


def before_mxnet(command, devices=None, mxnet=True):
    """What a command does before MXNet starts, then MXNet: ``OMP_NUM_THREADS`` for ``devices``
    simulated CPU devices (``threads.configure_threads``; ``GLUON_MGPU_CPU_DEVICES`` and the
    user's own value win) and ``prepare_mxnet``, each refusal one line on stderr and exit code
    2; then ``import mxnet`` (unless not ``mxnet``: a command that only starts others) inside
    ``starting``. Nothing once MXNet is imported (a command's ``main`` called in a program)."""
    if 'mxnet' in sys.modules:
        return
    from . import gpu_build, threads
    try:
        threads.configure_threads(devices=None if os.environ.get(threads.DEVICES_ENV) else devices)
        prepare_mxnet()
    except (ValueError, gpu_build.GPUBuildError) as e:
        sys.stderr.write('%s: error: %s\n' % (command, e))
        raise SystemExit(2)
    threads.warn_if_imported_late()
    if not mxnet:
        return
    with starting(command):
        try:
            import mxnet  # noqa: F401  (what loads for seconds, or serves a dist job)
        except Exception as e:  # noqa: BLE001 (whatever stops MXNet's import: one line)
            sys.stderr.write('%s: error: %s\n' % (command, import_failure(e)))
            raise SystemExit(2)


def import_failure(e):
    """The message for error ``e`` raised by ``import mxnet``: the cause and the fix."""
    from . import threads
    from .checks import one_line
    what = '%s: %s' % (type(e).__name__, one_line(e, 200))
    library = os.environ.get('MXNET_LIBRARY_PATH')
    if isinstance(e, ModuleNotFoundError):
        return ('cannot import MXNet (%s) with this Python, %s; run the command with the '
                "virtualenv's Python (.venv/bin/python -m ...), or install the requirements "
                'into this one (pip install -r requirements.txt)' % (what, sys.executable))
    if isinstance(e, Warning):
        what = '%s: %s' % (type(e).__name__, one_line(e).split('. ')[0])
        return ('cannot import MXNet: a warning inside MXNet 1.9.1 was turned into an error '
                '(%s; PYTHONWARNINGS or -W is %s); let warnings be warnings (unset '
                "PYTHONWARNINGS, or add 'ignore::%s')"
                % (what, ','.join(sys.warnoptions) or 'error', type(e).__name__))
    if os.environ.get('DMLC_ROLE') == 'scheduler' and 'bind failed' in str(e):
        # The launcher found the port free; something took it before this import listened.
        return ('the scheduler of the dist job cannot listen on %s:%s (DMLC_PS_ROOT_URI, '
                'DMLC_PS_ROOT_PORT): the port is in use, by another job started at the same '
                'moment or another program; pass the launcher another --port, or leave --port '
                'out for a free one' % (os.environ.get('DMLC_PS_ROOT_URI'),
                                        os.environ.get('DMLC_PS_ROOT_PORT')))
    limits = [limit for _, limit, kind in threads.memory_limits() if kind == 'address']
    if limits and isinstance(e, OSError) and 'failed to map segment' in str(e):
        return ('cannot import MXNet: this process\'s address space (%s KiB) is too small to '
                'load libmxnet.so (%s); raise the limit (ulimit -v unlimited) or run where it is '
                'larger' % (limits[0], what))
    if library and isinstance(e, OSError):
        return ('cannot import MXNet: MXNET_LIBRARY_PATH=%s cannot be loaded (%s); unset '
                'MXNET_LIBRARY_PATH, or point it at a libmxnet.so of MXNet 1.9.1' % (library, what))
    return ('cannot import MXNet (%s); check the installation with pip install -r '
            'requirements.txt, and unset MXNET_LIBRARY_PATH if you set it' % what)


def join_job(kvstore, command='gluon_mgpu', root=None):
    """Join the job of ``kvstore`` (``JOB_KVSTORES``): 'horovod' as ``HorovodKVStore()``, a
    dist kvstore as ``mx.kv.create(kvstore)``, which waits for every other process of it inside
    MXNet, where Python sees no Ctrl-C. Here SIGINT, SIGTERM and SIGHUP end that wait at once,
    ``command`` saying so in one line (``interruptible``); ``root`` names the job's scheduler
    in it."""
    import mxnet as mx
    if kvstore == 'horovod':
        from .horovod import HorovodKVStore
        return HorovodKVStore()
    with interruptible(command, 'while waiting for the other processes of the %s job%s; '
                                'nothing was trained'
                       % (kvstore, ' (its scheduler at %s)' % root if root else '')):
        return mx.kv.create(kvstore)
