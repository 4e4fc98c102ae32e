"""CPU thread settings, chosen before MXNet starts.

On x86, MXNet's OpenMP set-up (``src/engine/openmp.cc``) halves the number of cores unless
``OMP_NUM_THREADS`` is set, assuming every core is a hyper-thread pair: on a 2-core machine
without hyper-threading it computes on one core. MXNet reads the variable once, when it is
first imported, so ``gluon_mgpu`` sets it on import (before importing MXNet) to the number of
cores this process may use, unless the user set it (or ``MXNET_OMP_MAX_THREADS``) already.
"""
import os
import sys

__all__ = ['configure_threads', 'thread_settings', 'format_thread_settings']

_SETTINGS = {}


def _usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def configure_threads(environ=None, mxnet_imported=None):
    """Set ``OMP_NUM_THREADS`` to the usable core count if nobody chose it; return what was chosen.

    Parameters
    ----------
    environ : dict, optional
        The environment to read and change (default ``os.environ``).
    mxnet_imported : bool, optional
        Whether MXNet was imported before us (default: look in ``sys.modules``); then it is too
        late to change anything, and the returned dict says so.

    Returns
    -------
    dict
        ``omp_num_threads`` (the value in force, or None if MXNet picks), ``cores`` (usable
        cores), and ``source``: ``'gluon_mgpu'`` (set here), ``'user'`` (already set) or
        ``'mxnet-imported-first'`` (MXNet had started with its own default).
    """
    environ = os.environ if environ is None else environ
    if mxnet_imported is None:
        mxnet_imported = 'mxnet' in sys.modules
    cores = _usable_cores()
    if 'OMP_NUM_THREADS' in environ or 'MXNET_OMP_MAX_THREADS' in environ:
        value = environ.get('OMP_NUM_THREADS') or environ.get('MXNET_OMP_MAX_THREADS')
        settings = {'omp_num_threads': int(value) if str(value).isdigit() else value,
                    'cores': cores, 'source': 'user'}
    elif mxnet_imported:
        settings = {'omp_num_threads': None, 'cores': cores, 'source': 'mxnet-imported-first'}
    else:
        environ['OMP_NUM_THREADS'] = str(cores)
        settings = {'omp_num_threads': cores, 'cores': cores, 'source': 'gluon_mgpu'}
    if environ is os.environ:
        _SETTINGS.clear()
        _SETTINGS.update(settings)
    return settings


def thread_settings():
    """Return the settings chosen when ``gluon_mgpu`` was imported (see ``configure_threads``)."""
    return dict(_SETTINGS)



def format_thread_settings(settings=None):
    """One line for the CLI: which thread count is in force and who chose it."""
    s = thread_settings() if settings is None else settings
    if s['source'] == 'gluon_mgpu':
        return 'threads: OMP_NUM_THREADS=%d, one per usable core (set by gluon_mgpu)' % (
            s['omp_num_threads'])
    if s['source'] == 'user':
        return 'threads: OMP_NUM_THREADS=%s (set by you; %d usable cores)' % (
            s['omp_num_threads'], s['cores'])
    return ('threads: MXNet was imported before gluon_mgpu, so it uses its default (half the '
            'cores on x86); import gluon_mgpu first or set OMP_NUM_THREADS=%d' % s['cores'])
