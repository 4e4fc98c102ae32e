"""What a bug report needs: ``python -m gluon_mgpu.env`` reports Python, MXNet's build, the CUDA
libraries, the NVIDIA driver and its GPUs, the threads and the data folder (docs/gpu.md).
"""
import ctypes
import os
import platform
import sys
from importlib import metadata

from . import cli
from ..devices import num_gpus
from ..runtime.gpu_build import DRIVER_LIBRARY, DRIVER_VERSIONS, LIBRARIES, gpu_build
from ..runtime.threads import format_thread_settings

PROG = 'python -m gluon_mgpu.env'
# The driver API's codes that a machine without a usable GPU returns.
CUDA_ERRORS = {3: 'CUDA_ERROR_NOT_INITIALIZED', 34: 'CUDA_ERROR_STUB_LIBRARY',
               35: 'CUDA_ERROR_INSUFFICIENT_DRIVER', 100: 'CUDA_ERROR_NO_DEVICE',
               999: 'CUDA_ERROR_UNKNOWN'}
_RTLD_DI_LINKMAP = 2
_ENV_PREFIXES = ('MXNET_', 'CUDA_VISIBLE_DEVICES', 'LD_LIBRARY_PATH')


class _LinkMap(ctypes.Structure):
    # The head of glibc's struct link_map (<link.h>): l_name is the file the loader opened.
    _fields_ = [('l_addr', ctypes.c_void_p), ('l_name', ctypes.c_char_p)]


def loaded_from(soname):
    """Return the file this process loaded ``soname`` from, or None if it is not loaded
    (``dlopen`` with ``RTLD_NOLOAD``, then ``dlinfo``: nothing new is loaded)."""
    try:
        handle = ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)._handle
    except OSError:
        return None
    try:  # glibc >= 2.34 has dlinfo in libc itself, older ones in libdl
        dlinfo = getattr(ctypes.CDLL(None), 'dlinfo', None) or ctypes.CDLL('libdl.so.2').dlinfo
    except (OSError, AttributeError):
        return soname
    link_map = ctypes.POINTER(_LinkMap)()
    dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    if dlinfo(handle, _RTLD_DI_LINKMAP, ctypes.byref(link_map)) != 0 or not link_map:
        return soname
    name = link_map.contents.l_name
    return os.fsdecode(name) if name else soname


def driver_info(library=DRIVER_LIBRARY):
    """Ask the NVIDIA driver's ``libcuda`` (``library``: soname or file) for its CUDA version
    and its GPUs.

    Returns
    -------
    dict
        ``found`` (bool), ``cuda_version`` (``'12.2'`` or None), ``gpus`` (list of dicts with
        ``index``, ``name``, ``memory_bytes``) and ``errors`` (the calls that failed, with the
        driver's error code).
    """
    info = {'found': False, 'cuda_version': None, 'gpus': [], 'errors': []}
    try:
        cuda = ctypes.CDLL(library)
    except OSError as e:
        info['errors'].append(str(e))
        return info
    info['found'] = True

    def failed(call, *args, gpu=''):
        rc = getattr(cuda, call)(*args)
        if rc:
            info['errors'].append('%s%s: error %d (%s)'
                                  % (call, gpu, rc, CUDA_ERRORS.get(rc, 'see cuda.h')))
        return rc

    version, count = ctypes.c_int(), ctypes.c_int()
    if not failed('cuDriverGetVersion', ctypes.byref(version)):
        info['cuda_version'] = '%d.%d' % (version.value // 1000, version.value % 1000 // 10)
    if failed('cuInit', 0) or failed('cuDeviceGetCount', ctypes.byref(count)):
        return info
    for i in range(count.value):
        device, memory = ctypes.c_int(), ctypes.c_size_t()
        name = ctypes.create_string_buffer(256)
        gpu = ' (GPU %d)' % i
        if not (failed('cuDeviceGet', ctypes.byref(device), i, gpu=gpu) or
                failed('cuDeviceGetName', name, len(name), device, gpu=gpu) or
                failed('cuDeviceTotalMem_v2', ctypes.byref(memory), device, gpu=gpu)):
            info['gpus'].append({'index': i, 'name': name.value.decode(errors='replace'),
                                 'memory_bytes': memory.value})
    return info


def kernel_module_version(path='/proc/driver/nvidia/version'):
    """The NVIDIA kernel module's version (``'535.54.03'``) from ``path``, or None."""
    try:
        with open(path) as f:
            words = f.readline().split()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023"
    return words[words.index('Module') + 1] if 'Module' in words[:-1] else None


def _version(distribution):
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def collect():
    """Return the facts of the report as a dict (see ``format_report`` for the keys' meaning)."""
    import mxnet as mx

    from .._version import __version__
    from ..data import DataError, DataNotFoundError, find_data_dir
    libraries = [(soname, loaded_from(soname)) for _, soname in LIBRARIES]
    libraries.append((DRIVER_LIBRARY, loaded_from(DRIVER_LIBRARY)))
    try:
        data_dir, data_error = find_data_dir(), None
    except (DataError, DataNotFoundError) as e:  # the report says what is wrong with the data
        data_dir, data_error = None, str(e)
    return {
        'python': sys.version.split()[0],
        'executable': sys.executable,
        'platform': platform.platform(),
        'gluon_mgpu': __version__,
        'gluon_mgpu_path': os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        'mxnet': mx.__version__,
        'mxnet_path': os.path.dirname(os.path.abspath(mx.__file__)),
        'build': gpu_build() or 'mxnet %s (CPU build)' % (_version('mxnet') or mx.__version__),
        'features': [f.name for f in mx.runtime.Features().values() if f.enabled],
        'libmxnet': mx.libinfo.find_lib_path()[0],  # the one base.py loaded
        'libraries': libraries,
        'kernel_module': kernel_module_version(),
        'driver': driver_info() if libraries[-1][1] else None,
        'mxnet_gpus': num_gpus(),
        'threads': format_thread_settings(),
        'data_dir': data_dir,
        'data_error': data_error,
        'numpy': _version('numpy'),
        'd2lzh': _version('d2lzh'),
        'environment': sorted((k, v) for k, v in os.environ.items()
                              if k.startswith(_ENV_PREFIXES)),
    }


def format_report(info):
    """The report as text, one fact per line, from ``collect()``'s dict."""
    lines = ['Python:       %s (%s)' % (info['python'], info['executable']),
             'Platform:     %s' % info['platform'],
             'gluon_mgpu:   %s (%s)' % (info['gluon_mgpu'], info['gluon_mgpu_path']),
             'MXNet:        %s (%s)' % (info['mxnet'], info['mxnet_path']),
             'build:        %s' % info['build'],
             'features:     %s' % ' '.join(info['features']),
             'libmxnet:     %s' % info['libmxnet'],
             'numpy:        %s' % info['numpy'],
             'd2lzh:        %s' % (info['d2lzh'] or 'not installed')]
    if 'CUDA' in info['features']:
        lines.append('CUDA libraries (loaded from):')
        width = max(len(s) for s, _ in info['libraries'])
        for soname, path in info['libraries']:
            shown = path or 'not loaded'
            if path and os.path.realpath(path) != path:
                shown += ' -> %s' % os.path.realpath(path)
            lines.append('  %-*s  %s' % (width, soname, shown))
    else:
        lines.append('CUDA libraries: none (the CPU build of MXNet loads none)')
    driver = info['driver']
    module = info['kernel_module'] or 'unknown (no /proc/driver/nvidia/version)'
    if driver is None:
        lines.append('NVIDIA driver: none (%s is not loaded)' % DRIVER_LIBRARY)
    else:
        lines.append('NVIDIA driver: kernel module %s, for CUDA %s'
                     % (module, driver['cuda_version'] or 'unknown'))
        lines.extend('  %s' % e for e in driver['errors'])
        # What the GPU build (CUDA 11.2, NVRTC 11.8 from the wheels) needs from the driver.
        cuda = driver['cuda_version'] and tuple(int(x) for x in driver['cuda_version'].split('.'))
        if cuda and cuda < (11, 8) and 'CUDA' in info['features']:
            lines.append('  too old for the CUDA 11 build of MXNet: install a driver %s'
                         % DRIVER_VERSIONS if cuda < (11, 0) else
                         "  MXNet's fused kernels (compiled by NVRTC 11.8) need a driver for CUDA "
                         '11.8 (>= 520): update the driver or set MXNET_USE_FUSION=0')
    gpus = driver['gpus'] if driver else []
    lines.append('GPUs:         %d seen by the driver, %d by MXNet'
                 % (len(gpus), info['mxnet_gpus']))
    lines += ['  gpu(%d): %s, %.1f GiB' % (g['index'], g['name'], g['memory_bytes'] / 2 ** 30)
              for g in gpus]
    lines.append(info['threads'])
    lines.append('data:         %s' % (info['data_dir'] or info['data_error']))
    if info['environment']:
        lines.append('environment:')
        lines.extend('  %s=%s' % kv for kv in info['environment'])
    else:
        lines.append('environment:  no MXNET_*, CUDA_VISIBLE_DEVICES or LD_LIBRARY_PATH set')
    return '\n'.join(lines)


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.env``: print the report; return the exit code."""
    parser = cli.Parser(prog=PROG, description='Print what a bug report needs: Python, MXNet and '
                        'its build, where each CUDA library came from, the NVIDIA driver and '
                        'GPUs, threads, the data folder and the MXNET_* variables.')
    return cli.run_report(PROG, sys.argv[1:] if argv is None else list(argv), parser.parse_args,
                          lambda args: print(format_report(collect())),
                          'before the report was printed')
