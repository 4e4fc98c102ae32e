"""The GPU build's checks, on a machine without a GPU: ``make gpu-test``.

pytest runs in the CPU environment (.venv, the CPU build of MXNet); the GPU environment's Python
(.venv-gpu, mxnet-cu112 and the nvidia-*-cu11 wheels) is named by ``GLUON_MGPU_GPU_PYTHON`` and
every check runs it as a subprocess, with or without a stand-in ``libcuda.so.1`` that the
session compiles with the system C compiler. ``make test`` never collects this folder.
"""
import os
import shutil
import subprocess
import sys

import pytest

# libmxnet.so's driver functions (nm -D --undefined-only | grep ' cu[A-Z]'), what cudart asks
# for first, and what gluon_mgpu.env asks: all answer CUDA_ERROR_NO_DEVICE, as the driver of a
# machine without a GPU does. libmxnet.so is loaded with RTLD_NOW: each must exist.
NO_DEVICE_STUB = r'''
/* A stand-in for the NVIDIA driver's libcuda.so.1 on a machine without a GPU. */
#define NO_DEVICE(name) int name(void) { return 100; /* CUDA_ERROR_NO_DEVICE */ }
NO_DEVICE(cuInit) NO_DEVICE(cuDriverGetVersion) NO_DEVICE(cuGetProcAddress)
NO_DEVICE(cuDeviceGetCount) NO_DEVICE(cuDeviceGet) NO_DEVICE(cuDeviceGetName)
NO_DEVICE(cuDeviceTotalMem_v2) NO_DEVICE(cuDevicePrimaryCtxRetain) NO_DEVICE(cuGetErrorString)
NO_DEVICE(cuGraphKernelNodeGetParams) NO_DEVICE(cuGraphNodeGetType) NO_DEVICE(cuLaunchKernel)
NO_DEVICE(cuModuleGetFunction) NO_DEVICE(cuModuleLoadData) NO_DEVICE(cuModuleLoadDataEx)
NO_DEVICE(cuModuleUnload)
'''

# For gluon_mgpu.commands.env.driver_info only (loaded by path, never by MXNet): a driver for CUDA 11.4
# with one 16 GiB GPU.
ONE_GPU_STUB = r'''
#include <stddef.h>
#include <string.h>
int cuDriverGetVersion(int *version) { *version = 11040; return 0; }
int cuInit(unsigned int flags) { return 0; }
int cuDeviceGetCount(int *count) { *count = 1; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int device) {
    strncpy(name, "Stand-in GPU", len); return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int device) { *bytes = (size_t)16 << 30; return 0; }
'''


def _compile(source, folder, name):
    cc = shutil.which('cc')
    if cc is None:
        pytest.fail('no C compiler (cc) to build the stand-in libcuda.so.1: '
                    'apt-get install gcc')
    c_file = os.path.join(folder, name + '.c')
    with open(c_file, 'w') as f:
        f.write(source)
    lib = os.path.join(folder, name)
    subprocess.run([cc, '-shared', '-fPIC', '-Wl,-soname,' + name, '-o', lib, c_file],
                   check=True)
    return lib


@pytest.fixture(scope='session')
def gpu_python():
    """The GPU environment's Python (``GLUON_MGPU_GPU_PYTHON``), checked to hold mxnet-cu112."""
    python = os.environ.get('GLUON_MGPU_GPU_PYTHON')
    if not python or not os.path.isfile(python):
        pytest.fail('GLUON_MGPU_GPU_PYTHON=%r is not a Python; run these checks with '
                    'make gpu-test, which builds .venv-gpu and sets it' % (python,))
    return os.path.abspath(python)


@pytest.fixture(scope='session')
def gpu_site(gpu_python):
    """The GPU environment's site-packages folder."""
    out = subprocess.run([gpu_python, '-I', '-c',
                          'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                         check=True, capture_output=True, text=True).stdout
    return out.strip()


@pytest.fixture(scope='session')
def stub_dir(tmp_path_factory):
    """A folder holding the no-device stand-in, as ``libcuda.so.1``."""
    folder = str(tmp_path_factory.mktemp('driver'))
    _compile(NO_DEVICE_STUB, folder, 'libcuda.so.1')
    return folder


@pytest.fixture(scope='session')
def one_gpu_stub(tmp_path_factory):
    """The file of the one-GPU stand-in (not named libcuda.so.1: nothing loads it by accident)."""
    return _compile(ONE_GPU_STUB, str(tmp_path_factory.mktemp('one_gpu')), 'libonegpu.so')


@pytest.fixture
def run(tmp_path):
    """``run(python, args, driver=None, **env)``: a subprocess in a fresh folder, text output.

    ``driver`` is a folder put on ``LD_LIBRARY_PATH`` (the stand-in's); without it the loader
    finds no ``libcuda.so.1``, as on this machine.
    """
    def run(python, args, driver=None, **env):
        environ = {k: v for k, v in os.environ.items()
                   if k not in ('LD_LIBRARY_PATH', 'PYTHONPATH') and not k.startswith('MXNET_')}
        if driver:
            environ['LD_LIBRARY_PATH'] = driver
        environ.update(env)
        return subprocess.run([python] + list(args), cwd=str(tmp_path), env=environ,
                              capture_output=True, text=True, timeout=600)
    return run


@pytest.fixture(scope='session')
def cpu_python():
    """The Python running pytest: the CPU environment (its MXNet must be the CPU build)."""
    from gluon_mgpu.runtime.gpu_build import gpu_build
    if gpu_build() is not None:
        pytest.fail('pytest runs with %s, which has %s; run make gpu-test, which uses .venv'
                    % (sys.executable, gpu_build()))
    return sys.executable
