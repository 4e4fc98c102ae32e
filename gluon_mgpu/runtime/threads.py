"""CPU thread settings, chosen before MXNet starts: ``OMP_NUM_THREADS`` for the usable cores, or
``cores // N`` per simulated device, and a warning when MXNet was imported first; how many
simulated devices the machine's limit on threads can hold. docs/devices.md explains why.
"""
import logging
import os
import platform
import re
import resource
import sys

from .checks import is_digits

__all__ = ['configure_threads', 'thread_settings', 'format_thread_settings',
           'mxnet_default_threads', 'imported_late_warning', 'warn_if_imported_late',
           'thread_limit', 'threads_per_cpu_context', 'max_cpu_devices',
           'check_cpu_device_count', 'usable_cores', 'has_gpu', 'DEVICES_ENV',
           'devices_from_environment', 'read_text']

_SETTINGS = {}
DEVICES_ENV = 'GLUON_MGPU_CPU_DEVICES'
ENGINE_BASE_THREADS = 6  # MXNet's threads besides the contexts' (docs/devices.md, "How many")
# What the package set, so that a child process (a notebook's `!python -m gluon_mgpu.train`)
# can tell the package's values, which it may choose again, from the user's.
CHOSEN_ENV = 'GLUON_MGPU_CHOSE'


def usable_cores():
    """The cores this process may run on (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def has_gpu():
    # Without importing MXNet: the NVIDIA driver's device files.
    try:
        return any(re.fullmatch(r'nvidia\d+', name) for name in os.listdir('/dev'))
    except OSError:
        return False


def read_text(path):
    """The text of file ``path``, or '' when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ''


def _read_int(path):
    text = read_text(path).strip()
    return int(text) if is_digits(text) else None


def _cgroup_values(controller, v1_name, v2_name):
    """``(n, file name)`` for each cgroup of this process (/proc/self/cgroup's order) whose
    ``controller`` file (``v1_name`` in cgroup v1, ``v2_name`` in v2) holds a whole number."""
    for line in read_text('/proc/self/cgroup').splitlines():
        _, controllers, path = line.split(':', 2)
        if controllers == '' or controller in controllers.split(','):
            name = v1_name if controllers else v2_name
            found = _read_int('/sys/fs/cgroup%s%s/%s' % ('/' + controller if controllers else '',
                                                         path.rstrip('/'), name))
            if found is not None:
                yield found, name


def memory_bytes(path='/proc/meminfo'):
    """This machine's memory (``MemTotal``), or None when unknown."""
    found = re.search(r'^MemTotal:\s*([0-9]+)\b', read_text(path), re.M)
    return int(found[1]) * 1024 if found else None


def memory_limits():
    """The limits on this process's memory besides the machine's: ``[(bytes, what, kind)]``,
    ``kind`` ``'address'`` for address space (``ulimit -v``, which counts every mapping, also
    what is reserved and never touched) or ``'resident'`` (the cgroup's ``memory.max``, v2, or
    ``memory.limit_in_bytes``, v1); empty when nothing limits it."""
    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, 'ulimit -v %d' % (soft // 1024), 'address'))
    for found, name in _cgroup_values('memory', 'memory.limit_in_bytes', 'memory.max'):
        if found < 2 ** 62:  # v1 says "no limit" as 2**63 - 4096
            limits.append((found, "the cgroup's %s" % name, 'resident'))
    return limits


def memory_used():
    """``(address space, resident)`` of this process in bytes (``/proc/self/status``), 0 when
    unknown."""
    found = dict(re.findall(r'^(VmSize|VmRSS):\s*([0-9]+)\b', read_text('/proc/self/status'), re.M))
    return tuple(int(found.get(key, 0)) * 1024 for key in ('VmSize', 'VmRSS'))


def thread_limit():
    """``(n, source)``: the most threads this process could have, and which limit says so
    (``'ulimit -u'``, ``'kernel.threads-max'``, ``'kernel.pid_max'``: every thread takes a
    process id, or ``"the cgroup's pids.max"``); ``(None, None)`` when nothing limits it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    # Root (CAP_SYS_RESOURCE) is exempt from RLIMIT_NPROC.
    limits = [(soft, 'ulimit -u')] if soft != resource.RLIM_INFINITY and os.geteuid() else []
    cgroup, _ = next(_cgroup_values('pids', 'pids.max', 'pids.max'), (None, None))
    for found, source in ((_read_int('/proc/sys/kernel/threads-max'), 'kernel.threads-max'),
                          (_read_int('/proc/sys/kernel/pid_max'), 'kernel.pid_max'),
                          (cgroup, "the cgroup's pids.max")):
        if found:
            limits.append((found, source))
    return min(limits) if limits else (None, None)


def threads_per_cpu_context():
    """The threads each CPU context costs: ``OMP_NUM_THREADS`` (MXNet's default, half the cores,
    when unset) for MXNet, and one that issues its calls (``runtime.dispatch``)."""
    value = thread_settings().get('omp_num_threads')
    if isinstance(value, int) and value > 0:
        return value + 1
    return max(1, (os.cpu_count() or 2) // 2) + 1


def max_cpu_devices():
    """Return ``(n, reason)``: how many simulated CPU devices this machine can hold, and why:
    a run may take half of the threads the tightest limit allows (``thread_limit``)."""
    limit, source = thread_limit()
    if limit is None:
        return None, 'no limit on threads is known'
    per_context = threads_per_cpu_context()
    n = max(1, (limit // 2 - ENGINE_BASE_THREADS) // per_context)
    return n, ('a CPU context costs %d threads (OMP_NUM_THREADS for MXNet, 1 to issue its '
               'calls), and one run may take half of the %d threads %s allows'
               % (per_context, limit, source))


def check_cpu_device_count(n):
    """Raise ``ValueError`` if ``n`` CPU contexts are more than ``max_cpu_devices()``."""
    most, reason = max_cpu_devices()
    if most is not None and n > most:
        raise ValueError('num_gpus=%d simulated CPU devices are more than this machine can hold '
                         '(at most %d: %s); pass at most %d (CPU contexts share the same cores, '
                         'so a few, 2 to 8, show the data parallelism as well)'
                         % (n, most, reason, most))


def devices_from_environment(environ):
    """``GLUON_MGPU_CPU_DEVICES`` as a count, or None when unset; ``ValueError`` naming a bad
    value."""
    value = environ.get(DEVICES_ENV, '')
    if value == '':
        return None
    if not is_digits(value) or int(value) < 1:
        raise ValueError('%s=%r is not a whole number >= 1; set it to the number of simulated '
                         'CPU devices (for example %s=2) or unset it' % (DEVICES_ENV, value,
                                                                         DEVICES_ENV))
    return int(value)


def configure_threads(environ=None, mxnet_imported=None, devices=None):
    """Choose ``OMP_NUM_THREADS`` in ``environ`` (default ``os.environ``) before MXNet starts,
    for ``devices`` simulated CPU devices (default ``GLUON_MGPU_CPU_DEVICES``, else 1), unless
    ``mxnet_imported`` (default: look in ``sys.modules``), when it is too late.

    Returns
    -------
    dict
        ``omp_num_threads`` (in force), ``cores`` (usable), ``source`` (``'gluon_mgpu'``,
        ``'user'`` or ``'mxnet-imported-first'``: MXNet's default, ``mxnet_default_threads()``),
        ``devices``, and ``cpu_temp_copy`` (the scratch-buffer pool per issuing thread, None
        for MXNet's default of 4) with ``temp_copy_source`` (``'user'`` or ``'mxnet'``).

    Raises ValueError for a ``GLUON_MGPU_CPU_DEVICES`` that is not a whole number >= 1.
    """
    environ = os.environ if environ is None else environ
    mxnet_imported = 'mxnet' in sys.modules if mxnet_imported is None else mxnet_imported
    devices = (devices_from_environment(environ) if devices is None else devices) or 1
    cores = usable_cores()
    if not mxnet_imported:
        # Values a parent process's gluon_mgpu set are not the user's: choose them again.
        for item in environ.pop(CHOSEN_ENV, '').split():
            name, _, value = item.partition('=')
            if name in ('OMP_NUM_THREADS', 'MXNET_CPU_TEMP_COPY') and environ.get(name) == value:
                del environ[name]
    for name in ('OMP_NUM_THREADS', 'MXNET_OMP_MAX_THREADS'):
        if environ.get(name) == '':  # MXNet takes an empty value for unset
            del environ[name]
    value = environ.get('OMP_NUM_THREADS') or environ.get('MXNET_OMP_MAX_THREADS')
    if value is not None:
        threads, source = _number(value), 'user'
    elif mxnet_imported:
        threads, source = mxnet_default_threads(cores), 'mxnet-imported-first'
    else:
        # A horovodrun job's processes on this machine share its cores.
        local = environ.get('HOROVOD_LOCAL_SIZE', '')
        local = int(local) if is_digits(local) and int(local) >= 1 else 1
        threads, source = max(1, cores // (devices * local)), 'gluon_mgpu'
        environ['OMP_NUM_THREADS'] = str(threads)
        environ[CHOSEN_ENV] = 'OMP_NUM_THREADS=%d' % threads
    copy = environ.get('MXNET_CPU_TEMP_COPY')
    settings = {'omp_num_threads': threads, 'cores': cores, 'source': source, 'devices': devices,
                'cpu_temp_copy': None if copy is None else _number(copy),
                'temp_copy_source': 'mxnet' if copy is None else 'user'}
    if environ is os.environ:
        _SETTINGS.clear()
        _SETTINGS.update(settings)
    return settings


def _number(value):
    return int(value) if is_digits(str(value)) else value


def mxnet_default_threads(cores=None, machine=None):
    """The OpenMP threads MXNet 1.9.1 computes with when ``OMP_NUM_THREADS`` was not set as it
    started: half the usable cores on x86 (``src/engine/openmp.cc``), at least 1; all of them
    elsewhere (docs/devices.md)."""
    cores = usable_cores() if cores is None else cores
    machine = platform.machine() if machine is None else machine
    x86 = machine.lower() in ('x86_64', 'amd64', 'i386', 'i686', 'x86')
    return max(1, cores // 2) if x86 else cores


def imported_late_warning(settings=None):
    """The warning line for MXNet imported before the package with fewer threads than cores,
    or None: it names the count in force and the fix."""
    s = thread_settings() if settings is None else settings
    if s.get('source') != 'mxnet-imported-first' or s['omp_num_threads'] >= s['cores']:
        return None
    return ('warning: MXNet was imported before gluon_mgpu, so it computes with %d of the %d '
            'cores (its default, fixed when it starts); import gluon_mgpu before d2lzh and mxnet '
            '(in a notebook: restart the kernel first), or set OMP_NUM_THREADS=%d before Python '
            'starts' % (s['omp_num_threads'], s['cores'], s['cores']))


def warn_if_imported_late():
    """Log ``imported_late_warning()`` on the ``gluon_mgpu`` logger (one line on stderr)."""
    line = imported_late_warning()
    if line is not None:
        logging.getLogger('gluon_mgpu').warning(line)


def thread_settings():
    """Return the settings chosen when ``gluon_mgpu`` was imported (see ``configure_threads``)."""
    return dict(_SETTINGS)


def format_thread_settings(settings=None):
    """One line for the CLI: which thread count and scratch-buffer pool are in force, who chose."""
    s = thread_settings() if settings is None else settings
    devices = s.get('devices', 1)
    if s['source'] == 'gluon_mgpu' and devices >= 2:
        line = ('threads: OMP_NUM_THREADS=%d per simulated device, %d devices on %d usable cores '
                '(set by gluon_mgpu)' % (s['omp_num_threads'], devices, s['cores']))
    elif s['source'] == 'gluon_mgpu':
        line = 'threads: OMP_NUM_THREADS=%d, one per usable core (set by gluon_mgpu)' % (
            s['omp_num_threads'])
    elif s['source'] == 'user':
        line = 'threads: OMP_NUM_THREADS=%s (set by you; %d usable cores)' % (
            s['omp_num_threads'], s['cores'])
    else:
        line = ('threads: OMP_NUM_THREADS=%s of %d usable cores, MXNet\'s default (half the cores '
                'on x86), as MXNet was imported before gluon_mgpu; import gluon_mgpu first or set '
                'OMP_NUM_THREADS=%d' % (s['omp_num_threads'], s['cores'], s['cores']))
    if s.get('temp_copy_source') == 'user':
        line += '; scratch buffers: MXNET_CPU_TEMP_COPY=%s (set by you)' % s['cpu_temp_copy']
    return line
