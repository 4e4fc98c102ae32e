"""What ``import mxnet`` needs first, in any import order: numpy 1's names on numpy 2
(``numpy_compat``), and for the GPU build of MXNet on a machine that has nothing but the NVIDIA
driver, the CUDA libraries of NVIDIA's wheels, or one line saying that the driver is missing.
It imports only the standard library, since a ``.pth`` file that ``make install`` writes loads
it by path (docs/install.md, docs/gpu.md); as a script:
``python gluon_mgpu/runtime/gpu_build.py install-hook``.
"""
import os
import re
import sys
import sysconfig

__all__ = ['LIBRARIES', 'DRIVER_LIBRARY', 'DRIVER_VERSIONS', 'GPUBuildError', 'NoDriverError',
           'gpu_build', 'library_paths', 'no_driver_message', 'prepare',
           'install_finder', 'install_hook', 'numpy_compat', 'HOOK_NAME']

# (folder under site-packages/nvidia/, soname): each after the libraries it needs (cuBLAS needs
# cuBLASLt, cuSOLVER needs both), libmxnet.so's NEEDED entries in full but libcuda.so.1.
LIBRARIES = (
    ('cuda_runtime', 'libcudart.so.11.0'),
    ('cublas', 'libcublasLt.so.11'),
    ('cublas', 'libcublas.so.11'),
    ('cufft', 'libcufft.so.10'),
    ('curand', 'libcurand.so.10'),
    ('cusolver', 'libcusolver.so.11'),
    ('cuda_nvrtc', 'libnvrtc.so.11.2'),
    ('nvtx', 'libnvToolsExt.so.1'),
    ('nccl', 'libnccl.so.2'),
    ('cudnn', 'libcudnn.so.8'),
)
DRIVER_LIBRARY = 'libcuda.so.1'
# NVIDIA's minor-version compatibility: an 11.x build on 11.8 libraries runs on >= 450.80.02;
# the PTX that NVRTC 11.8 makes for MXNet's fused kernels needs a driver for CUDA 11.8 (>= 520).
DRIVER_VERSIONS = '>= 450.80.02, or >= 520 for fused kernels'
HOOK_NAME = 'gluon_mgpu_mxnet.pth'
_HOOK_MARK = "# gluon_mgpu: before mxnet, numpy 1's names and the nvidia-*-cu11 libraries"


class GPUBuildError(ImportError):
    """The GPU build of MXNet is installed but cannot load; the message is one line and the fix."""


class NoDriverError(GPUBuildError):
    """The GPU build of MXNet is installed and ``libcuda.so.1`` (the NVIDIA driver) is not."""


def gpu_build(path=None):
    """Return the GPU build of MXNet that ``import mxnet`` would load from the folders ``path``
    (default ``sys.path``): ``'mxnet-cu112 1.9.1'`` for an ``mxnet-cu*`` wheel; None for the
    CPU build or no MXNet."""
    for folder in sys.path if path is None else path:
        folder = folder or os.curdir
        if not os.path.isfile(os.path.join(folder, 'mxnet', '__init__.py')):
            continue
        found = (re.match(r'mxnet_(cu\d+)-([^-]+)\.dist-info$', n)
                 for n in sorted(os.listdir(folder)))
        return next(('mxnet-%s %s' % m.groups() for m in found if m), None)
    return None


def library_paths(path=None):
    """``[(soname, file or None), ...]``: where on ``path`` (as in :func:`gpu_build`) the nvidia
    wheels put each library; None when no wheel has it."""
    folders = sys.path if path is None else path
    found = []
    for package, soname in LIBRARIES:
        candidates = (os.path.join(f or os.curdir, 'nvidia', package, 'lib', soname)
                      for f in folders)
        found.append((soname, next((c for c in candidates if os.path.isfile(c)), None)))
    return found


def no_driver_message(build):
    """The one line for a GPU build without a driver: what is wrong and both ways out."""
    return ('the GPU build of MXNet (%s) is installed but no NVIDIA driver was found (%s cannot '
            'be loaded); install the NVIDIA driver (%s), or use the CPU environment '
            '(requirements.txt: make test, make demo)' % (build, DRIVER_LIBRARY, DRIVER_VERSIONS))


def prepare(path=None):
    """Make the GPU build of MXNet loadable: call before ``import mxnet`` (docs/gpu.md).

    Loads each of :data:`LIBRARIES` with ``RTLD_GLOBAL``, from its wheel or else by soname,
    then checks that the driver's ``libcuda.so.1`` loads. Returns the libraries loaded (files
    or sonames; none with the CPU build); raises ``GPUBuildError`` when a CUDA library cannot
    be loaded, ``NoDriverError`` without the NVIDIA driver.
    """
    build = gpu_build(path)
    if build is None:
        return []
    import ctypes  # here, not at the top: the .pth file loads this module in every process
    loaded = []
    for soname, file in library_paths(path):
        try:
            ctypes.CDLL(file or soname, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise GPUBuildError(
                'the GPU build of MXNet (%s) is installed but %s cannot be loaded (%s); install '
                "NVIDIA's CUDA libraries with pip install -r requirements-gpu.txt "
                '(make gpu-install)' % (build, soname, e)) from None
        loaded.append(file or soname)
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        raise NoDriverError(no_driver_message(build)) from None
    return loaded


def numpy_compat():
    """The module ``numpy_compat`` beside this file, imported as the package's when this file
    is, else loaded by path (as the ``.pth`` file loads this one)."""
    if __package__:
        from . import numpy_compat as module
        return module
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        '_gluon_mgpu_numpy_compat', os.path.join(os.path.dirname(__file__), 'numpy_compat.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _MXNetFinder:
    """On ``sys.meta_path``: when ``mxnet`` is imported, gives numpy its numpy 1 names
    (``numpy_compat.restore``) and runs :func:`prepare`, then steps aside (after a failure it
    stays, so a second ``import mxnet`` raises the same error)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == 'mxnet':
            numpy_compat().restore()
            prepare()
            if cls in sys.meta_path:
                sys.meta_path.remove(cls)
        return None


def install_finder():
    """Put the finder first on ``sys.meta_path`` (what the ``.pth`` file runs); once only, even
    when two ``.pth`` files (two site folders) load this file."""
    names = [getattr(finder, '__qualname__', None) for finder in sys.meta_path]
    if 'mxnet' not in sys.modules and _MXNetFinder.__qualname__ not in names:
        sys.meta_path.insert(0, _MXNetFinder)


def install_hook(site_dir=None):
    """Write ``gluon_mgpu_mxnet.pth`` into ``site_dir`` (default: this Python's
    ``site-packages``) and return its path: its line loads this file by path at every start of
    Python and calls :func:`install_finder`. RuntimeError when a file of that name exists and
    was not written by this function."""
    site_dir = site_dir or sysconfig.get_paths()['purelib']
    target = os.path.join(site_dir, HOOK_NAME)
    if os.path.exists(target):
        with open(target) as f:
            if not f.readline().startswith(_HOOK_MARK):
                raise RuntimeError('%s exists and was not written by gluon_mgpu; move it away '
                                   'and run make install again' % target)
    source = os.path.abspath(__file__)
    line = ('import importlib.util as u; s = u.spec_from_file_location("_gluon_mgpu_gpu_build", '
            '%r); m = u.module_from_spec(s); s.loader.exec_module(m); m.install_finder()'
            % source)
    with open(target, 'w') as f:
        f.write('%s (%s)\n%s\n' % (_HOOK_MARK, source, line))
    return target


if __name__ == '__main__':
    if sys.argv[1:] != ['install-hook']:
        sys.stderr.write('usage: python gluon_mgpu/runtime/gpu_build.py install-hook\n')
        sys.exit(2)
    try:
        print("wrote %s: import mxnet now finds numpy 1's names and the nvidia-*-cu11 libraries"
              % install_hook())
    except RuntimeError as e:
        sys.stderr.write('error: %s\n' % e)
        sys.exit(2)
