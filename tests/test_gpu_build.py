"""gluon_mgpu.runtime.gpu_build's logic, with the CPU build and folders made here.

The GPU build itself (mxnet-cu112, the nvidia wheels, a stand-in driver) is checked by
tests_gpu/ under ``make gpu-test``; these tests need neither.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from gluon_mgpu.runtime import gpu_build as gb


def _site(folder, dist_info, libraries=()):
    """A site-packages folder with an ``mxnet`` package, its dist-info, and library files."""
    (folder / 'mxnet').mkdir(parents=True)
    (folder / 'mxnet' / '__init__.py').write_text('')
    (folder / dist_info).mkdir()
    for package, soname, content in libraries:
        lib = folder / 'nvidia' / package / 'lib'
        lib.mkdir(parents=True, exist_ok=True)
        (lib / soname).write_bytes(content)
    return str(folder)


def test_gpu_build_names_the_cuda_wheel_of_the_first_mxnet_on_the_path(tmp_path):
    gpu = _site(tmp_path / 'gpu', 'mxnet_cu112-1.9.1.dist-info')
    cpu = _site(tmp_path / 'cpu', 'mxnet-1.9.1.dist-info')
    assert gb.gpu_build([str(tmp_path / 'empty'), gpu, cpu]) == 'mxnet-cu112 1.9.1'
    assert gb.gpu_build([cpu, gpu]) is None
    assert gb.gpu_build([str(tmp_path)]) is None
    assert gb.gpu_build() is None  # this environment has the CPU build


def test_library_paths_follow_the_dependency_order_and_the_path(tmp_path):
    first = _site(tmp_path / 'a', 'mxnet_cu112-1.9.1.dist-info',
                  [('cudnn', 'libcudnn.so.8', b'')])
    second = _site(tmp_path / 'b', 'mxnet_cu112-1.9.1.dist-info',
                   [('cudnn', 'libcudnn.so.8', b''), ('nccl', 'libnccl.so.2', b'')])
    found = gb.library_paths([first, second])
    assert [soname for soname, _ in found] == [
        'libcudart.so.11.0', 'libcublasLt.so.11', 'libcublas.so.11', 'libcufft.so.10',
        'libcurand.so.10', 'libcusolver.so.11', 'libnvrtc.so.11.2', 'libnvToolsExt.so.1',
        'libnccl.so.2', 'libcudnn.so.8']
    found = dict(found)
    assert found['libcudnn.so.8'] == os.path.join(first, 'nvidia', 'cudnn', 'lib',
                                                  'libcudnn.so.8')
    assert found['libnccl.so.2'] == os.path.join(second, 'nvidia', 'nccl', 'lib',
                                                 'libnccl.so.2')
    assert found['libcudart.so.11.0'] is None


def test_prepare_does_nothing_for_the_cpu_build(tmp_path):
    assert gb.prepare() == []
    assert gb.prepare([_site(tmp_path, 'mxnet-1.9.1.dist-info')]) == []


def test_prepare_names_a_library_that_cannot_be_loaded(tmp_path):
    site = _site(tmp_path, 'mxnet_cu112-1.9.1.dist-info',
                 [('cuda_runtime', 'libcudart.so.11.0', b'not a shared object\n' * 20)])
    with pytest.raises(gb.GPUBuildError, match=r'^the GPU build of MXNet \(mxnet-cu112 1\.9\.1\) '
                       r'is installed but libcudart\.so\.11\.0 cannot be loaded \(.*invalid ELF '
                       r'header\); install NVIDIA\'s CUDA libraries with pip install -r '
                       r'requirements-gpu\.txt \(make gpu-install\)$'):
        gb.prepare([site])


_NO_DRIVER = textwrap.dedent("""
    import sys
    from gluon_mgpu.runtime import gpu_build as gb
    def no_driver(path=None):
        raise gb.NoDriverError(gb.no_driver_message('mxnet-cu112 1.9.1'))
    gb.prepare = no_driver
""")


def _started(code):
    return subprocess.run([sys.executable, '-c', _NO_DRIVER + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)


def test_a_command_without_a_driver_prints_one_line_and_exits_2():
    done = _started("""
        from gluon_mgpu.runtime.startup import before_mxnet
        before_mxnet('python -m gluon_mgpu.replicas')
        print('not reached')
    """)
    assert (done.returncode, done.stdout) == (2, '')
    assert done.stderr == 'python -m gluon_mgpu.replicas: error: %s\n' % (
        gb.no_driver_message('mxnet-cu112 1.9.1'))


def test_an_import_without_a_driver_raises_when_mxnet_is_imported_not_before():
    done = _started("""
        import gluon_mgpu
        print('imported', flush=True)
        try:
            import mxnet
        except ImportError as e:
            print(type(e).__name__, 'no NVIDIA driver' in str(e))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ['imported', 'NoDriverError', 'True']


def test_install_hook_writes_its_pth_and_keeps_a_foreign_one(tmp_path):
    target = gb.install_hook(str(tmp_path))
    assert target == str(tmp_path / 'gluon_mgpu_mxnet.pth')
    assert gb.install_hook(str(tmp_path)) == target  # its own file: written again
    (tmp_path / 'gluon_mgpu_mxnet.pth').write_text('import something_else\n')
    with pytest.raises(RuntimeError, match=r'gluon_mgpu_mxnet\.pth exists and was not written by '
                       r'gluon_mgpu; move it away and run make install again'):
        gb.install_hook(str(tmp_path))
    assert (tmp_path / 'gluon_mgpu_mxnet.pth').read_text() == 'import something_else\n'


def test_the_pth_hook_prepares_the_first_import_of_mxnet(tmp_path):
    # site.addsitedir processes .pth files as Python's start-up does.
    gb.install_hook(str(tmp_path))
    code = textwrap.dedent('''
        import site, sys
        site.addsitedir(sys.argv[1])
        def hooked():
            return [f.__name__ for f in sys.meta_path if getattr(f, '__name__', '') == '_MXNetFinder']
        print(hooked(), 'gluon_mgpu' in sys.modules)
        import mxnet
        print(hooked(), 'gluon_mgpu' in sys.modules)
        ''')
    r = subprocess.run([sys.executable, '-c', code, str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["['_MXNetFinder'] False", '[] False']


def test_the_script_takes_only_install_hook():
    script = gb.__file__
    r = subprocess.run([sys.executable, script, 'uninstall'], capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (2, 'usage: python gluon_mgpu/runtime/gpu_build.py '
                                           'install-hook\n')
