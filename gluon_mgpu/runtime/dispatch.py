"""Each device's calls issued from a thread of its own (``call(device, f, *args)``), so that each
simulated device draws on its own pool of MXNet's scratch buffers, as each GPU does.
docs/devices.md explains why, and what it means for random numbers.
"""
import os
import queue
import threading
import weakref

from mxnet import Context, autograd
from mxnet.gluon import Block

__all__ = ['call']

_THREADS = {}
_LOCK = threading.Lock()
# Blocks whose parameters all have their shapes: called from the device's thread.
_SHAPED = weakref.WeakSet()


class _Job:
    """One call: ``f(*args)`` with the caller's autograd state; ``done`` is set once it ran."""

    def __init__(self, f, args):
        self.f, self.args = f, args
        self.recording, self.training = autograd.is_recording(), autograd.is_training()
        self.result = self.error = None
        self.done = threading.Event()

    def run(self):
        try:  # the scope autograd.record() enters, restored after the call
            with autograd._RecordingStateScope(self.recording, self.training):
                self.result = self.f(*self.args)
        except BaseException as e:  # handed to the caller, who raises it
            self.error = e
        finally:
            self.done.set()


def _serve(jobs):
    while True:
        jobs.get().run()


def _thread_of(device):
    """``(thread, jobs)``: the thread that runs ``device``'s jobs one after the other, started
    on first use for the process's life, and its queue."""
    key = (device.device_type, device.device_id)
    with _LOCK:
        if key not in _THREADS:
            jobs = queue.SimpleQueue()
            thread = threading.Thread(target=_serve, args=(jobs,), daemon=True,
                                      name='gluon_mgpu %s' % (device,))
            thread.start()
            _THREADS[key] = thread, jobs
        return _THREADS[key]


def _waits_for_shapes(f):
    """Whether ``f`` is a Block with parameters whose initialization waits for their shapes."""
    if not isinstance(f, Block) or f in _SHAPED:
        return False
    if any(p._deferred_init for p in f.collect_params().values()):
        return True
    _SHAPED.add(f)
    return False


def call(device, f, *args):
    """Return ``f(*args)``, issued from the thread of ``device`` (an ``mxnet.Context``, else
    TypeError) under the caller's autograd state; a Block whose parameters still wait for
    their shapes is called from the caller's thread.

    Raises whatever ``f`` raised. A Ctrl-C while ``f`` runs is raised once ``f`` has returned,
    so the caller's next MXNet call cannot overlap it.
    """
    if not isinstance(device, Context):
        raise TypeError('device must be an mxnet.Context such as mx.cpu(1) or mx.gpu(0), got %r'
                        % (device,))
    thread, jobs = _thread_of(device)
    job = _Job(f, args)
    if threading.current_thread() is thread or _waits_for_shapes(f):
        # A call from inside a call, or a network's first: run it here.
        job.run()
    else:
        jobs.put(job)
        try:
            job.done.wait()
        except BaseException:
            job.done.wait()
            raise
    if job.error is not None:
        raise job.error
    return job.result


def _forget_threads():
    # A forked child has none of its parent's threads (and a lock one of them may have held):
    # it starts its own when it needs them.
    global _LOCK
    _LOCK = threading.Lock()
    _THREADS.clear()


os.register_at_fork(after_in_child=_forget_threads)
