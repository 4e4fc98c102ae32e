"""python -m gluon_mgpu.env with the CPU build (tests_gpu/ checks it with the GPU build)."""
import os
import subprocess
import sys

import mxnet as mx

import gluon_mgpu
from gluon_mgpu.commands import env


def test_loaded_from_names_the_file_and_loads_nothing_new():
    assert os.path.basename(env.loaded_from('libc.so.6')) == 'libc.so.6'
    assert os.path.isfile(env.loaded_from('libc.so.6'))
    assert env.loaded_from('libcudart.so.11.0') is None  # not loaded by the CPU build
    assert env.loaded_from('libcudart.so.11.0') is None  # and the first call did not load it


def test_driver_info_without_a_driver():
    info = env.driver_info('libcuda-that-is-not-here.so.1')
    assert (info['found'], info['cuda_version'], info['gpus']) == (False, None, [])
    assert info['errors'] == ['libcuda-that-is-not-here.so.1: cannot open shared object file: '
                              'No such file or directory']


def test_kernel_module_version(tmp_path):
    version = tmp_path / 'version'
    version.write_text('NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 '
                       '22:20:39 UTC 2023\nGCC version:  gcc version 12.2.0\n')
    assert env.kernel_module_version(str(version)) == '535.54.03'
    assert env.kernel_module_version(str(tmp_path / 'missing')) is None


def test_collect_describes_this_cpu_environment():
    info = env.collect()
    assert info['mxnet'] == mx.__version__ == '1.9.1'
    assert info['build'] == 'mxnet 1.9.1 (CPU build)'
    assert 'CUDA' not in info['features'] and 'MKLDNN' in info['features']
    assert all(path is None for _, path in info['libraries'])
    assert (info['driver'], info['mxnet_gpus']) == (None, 0)
    assert info['data_dir'] == gluon_mgpu.find_data_dir()


def test_a_broken_data_folder_is_reported_not_raised(tmp_path, monkeypatch, data_dir):
    # A folder holding all four names, one of them a folder: the report itself failed with
    # 'unexpected DataError' (read from the code; here the only candidate is that folder).
    from gluon_mgpu import data
    for name in os.listdir(data_dir):
        os.symlink(os.path.join(data_dir, name), tmp_path / name)
    os.remove(tmp_path / 't10k-labels-idx1-ubyte.gz')
    os.mkdir(tmp_path / 't10k-labels-idx1-ubyte.gz')
    monkeypatch.setattr(data, 'data_dir_candidates', lambda data_dir=None: [str(tmp_path)])
    info = env.collect()
    assert info['data_dir'] is None
    broken = tmp_path / 't10k-labels-idx1-ubyte.gz'
    assert info['data_error'].startswith('%s is a folder' % broken), info['data_error']


def test_the_command_prints_the_report(tmp_path):
    environ = dict(os.environ, MXNET_USE_FUSION='0')
    r = subprocess.run([sys.executable, '-m', 'gluon_mgpu.env'], capture_output=True, text=True,
                       env=environ, cwd=str(tmp_path), timeout=300)
    assert (r.returncode, r.stderr) == (0, '')
    lines = r.stdout.splitlines()
    assert lines[0] == 'Python:       %s (%s)' % (sys.version.split()[0], sys.executable)
    for line in ('build:        mxnet 1.9.1 (CPU build)',
                 'CUDA libraries: none (the CPU build of MXNet loads none)',
                 'NVIDIA driver: none (libcuda.so.1 is not loaded)',
                 'GPUs:         0 seen by the driver, 0 by MXNet',
                 'data:         %s' % gluon_mgpu.find_data_dir(),
                 '  MXNET_USE_FUSION=0'):
        assert line in lines
    assert any(line.startswith('threads: OMP_NUM_THREADS=') for line in lines)


def test_the_command_takes_no_arguments():
    r = subprocess.run([sys.executable, '-m', 'gluon_mgpu.env', '--gpus'], capture_output=True,
                       text=True, timeout=300)
    assert (r.returncode, r.stdout) == (2, '')
    assert r.stderr == ('python -m gluon_mgpu.env: error: unrecognized arguments: --gpus '
                        '(see --help)\n')
