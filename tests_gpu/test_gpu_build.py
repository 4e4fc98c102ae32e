"""mxnet-cu112 with NVIDIA's wheels, with a stand-in driver and without one (see conftest)."""
import ctypes
import os
import textwrap

import numpy as np
import pytest

from gluon_mgpu.commands.env import driver_info, format_report
from gluon_mgpu.runtime.gpu_build import LIBRARIES, no_driver_message

BUILD = 'mxnet-cu112 1.9.1'
COMMANDS = ('train', 'sweep', 'launch', 'compare', 'replicas', 'env')
HERE = os.path.dirname(os.path.abspath(__file__))


def _machine_has_driver():
    try:
        ctypes.CDLL('libcuda.so.1')
    except OSError:
        return False
    return True


no_driver_here = pytest.mark.skipif(
    _machine_has_driver(), reason='this machine has an NVIDIA driver (libcuda.so.1 loads): the '
    'checks of a GPU build without a driver need a machine without one')


def test_a_plain_script_imports_mxnet_with_the_wheels_libraries(gpu_python, gpu_site, stub_dir,
                                                                 run, tmp_path):
    # No gluon_mgpu, no LD_LIBRARY_PATH but the stand-in driver's: the .pth file does it.
    script = tmp_path / 'plain.py'
    script.write_text(textwrap.dedent('''
        import sys
        import mxnet as mx
        import d2lzh
        assert 'gluon_mgpu' not in sys.modules
        features = mx.runtime.Features()
        print(' '.join(f for f in ('CUDA', 'CUDNN', 'NCCL', 'CUDA_RTC') if features.is_enabled(f)))
        print(mx.context.num_gpus(), d2lzh.try_all_gpus())
        print((mx.nd.ones((2, 3), ctx=mx.cpu(1)) * 2).sum().asscalar())
        with open('/proc/self/maps') as f:
            print('\\n'.join(sorted({line.split()[-1] for line in f if '/nvidia/' in line})))
        '''))
    r = run(gpu_python, [str(script)], driver=stub_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ['CUDA CUDNN NCCL CUDA_RTC', '0 [cpu(0)]', '12.0']
    expected = {os.path.join(gpu_site, 'nvidia', folder, 'lib', soname)
                for folder, soname in LIBRARIES}
    assert expected <= set(lines[3:])


def test_a_notebook_kernel_imports_mxnet(gpu_python, stub_dir, run):
    code = textwrap.dedent('''
        import nbclient, nbformat
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            'import mxnet as mx; print(mx.runtime.Features().is_enabled("CUDA"), '
            'mx.context.num_gpus())')])
        nbclient.NotebookClient(nb, kernel_name='python3', timeout=300).execute()
        print(nb.cells[0].outputs[0]['text'].strip())
        ''')
    r = run(gpu_python, ['-c', code], driver=stub_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == 'True 0'


def test_the_report_shows_the_cuda_build_its_libraries_and_no_gpu(gpu_python, gpu_site,
                                                                  stub_dir, run):
    r = run(gpu_python, ['-m', 'gluon_mgpu.env'], driver=stub_dir, MXNET_USE_FUSION='0')
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert 'build:        %s' % BUILD in lines
    features = next(line for line in lines if line.startswith('features:')).split()[1:]
    assert {'CUDA', 'CUDNN', 'NCCL', 'CUDA_RTC'} <= set(features)
    for folder, soname in LIBRARIES:
        path = os.path.join(gpu_site, 'nvidia', folder, 'lib', soname)
        assert any(line.split() == [soname, path] for line in lines), soname
    assert any(line.split() == ['libcuda.so.1', os.path.join(stub_dir, 'libcuda.so.1')]
               for line in lines)
    assert '  cuInit: error 100 (CUDA_ERROR_NO_DEVICE)' in lines
    assert 'GPUs:         0 seen by the driver, 0 by MXNet' in lines
    assert '  MXNET_USE_FUSION=0' in lines


def test_get_devices_falls_back_to_simulated_devices(gpu_python, stub_dir, run):
    r = run(gpu_python, ['-c', 'import gluon_mgpu; print(gluon_mgpu.get_devices(2))'],
            driver=stub_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout == '[cpu(0), cpu(1)]\n'
    assert "warning: no GPU found, so [cpu(0), cpu(1)] are simulated devices" in r.stderr


def test_one_training_step_equals_the_cpu_builds(gpu_python, cpu_python, stub_dir, run,
                                                 tmp_path):
    step = os.path.join(HERE, 'one_step.py')
    for python, out, driver in ((cpu_python, 'cpu.npz', None),
                                (gpu_python, 'gpu.npz', stub_dir)):
        r = run(python, [step, str(tmp_path / out)], driver=driver)
        assert r.returncode == 0, r.stderr
    cpu, gpu = np.load(tmp_path / 'cpu.npz'), np.load(tmp_path / 'gpu.npz')
    assert cpu.files == gpu.files
    assert len(cpu.files) == 1 + 2 * 110  # the loss, then ResNet-18's 110 parameters per device
    assert 2.0 < float(cpu['train_loss']) < 2.6  # about ln(10): one step from a random start
    for k in cpu.files:
        assert np.abs(cpu[k] - gpu[k]).max() <= 1e-5, k
        if k.startswith('device0/'):
            assert np.array_equal(cpu[k], cpu[k.replace('device0/', 'device1/')]), k


@no_driver_here
@pytest.mark.parametrize('command', COMMANDS)
def test_without_a_driver_every_command_prints_one_line_and_exits_2(gpu_python, run, command):
    # Each command reads its flags first (its --help needs no driver, below), then would start
    # MXNet (launch: check what its processes would abort on).
    args = {'train': ['--epochs', '1'], 'sweep': ['--num-gpus', '1'],
            'launch': ['-n', '1', '--', 'true']}.get(command, [])
    r = run(gpu_python, ['-m', 'gluon_mgpu.' + command] + args)
    assert (r.returncode, r.stdout) == (2, '')
    assert r.stderr == 'python -m gluon_mgpu.%s: error: %s\n' % (command,
                                                                  no_driver_message(BUILD))


@no_driver_here
@pytest.mark.parametrize('command', COMMANDS)
def test_without_a_driver_every_commands_help_works(gpu_python, run, command):
    r = run(gpu_python, ['-m', 'gluon_mgpu.' + command, '--help'])
    assert r.returncode == 0 and r.stderr == '', r.stderr
    assert r.stdout.startswith('usage: python -m gluon_mgpu.%s ' % command)


@no_driver_here
def test_without_a_driver_imports_raise_the_same_line(gpu_python, run):
    message = no_driver_message(BUILD)
    # import gluon_mgpu starts nothing (not MXNet); MXNet's import, through it, says why.
    r = run(gpu_python, ['-c', 'import gluon_mgpu'])
    assert (r.returncode, r.stderr) == (0, '')
    r = run(gpu_python, ['-c', 'import gluon_mgpu; import mxnet'])
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == 'gluon_mgpu.runtime.gpu_build.NoDriverError: ' + message
    r = run(gpu_python, ['-c', 'import mxnet'])
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1].endswith('.NoDriverError: ' + message)
    assert 'OSError' not in r.stderr


def test_no_driver_message_is_one_line_with_both_fixes():
    message = no_driver_message(BUILD)
    assert '\n' not in message
    assert message.startswith('the GPU build of MXNet (mxnet-cu112 1.9.1) is installed but no '
                              'NVIDIA driver was found')
    assert 'install the NVIDIA driver (>= 450.80.02' in message
    assert 'use the CPU environment (requirements.txt: make test, make demo)' in message


def test_driver_info_reads_the_drivers_gpus(one_gpu_stub, stub_dir):
    info = driver_info(one_gpu_stub)
    assert info == {'found': True, 'cuda_version': '11.4', 'errors': [],
                    'gpus': [{'index': 0, 'name': 'Stand-in GPU', 'memory_bytes': 16 << 30}]}
    assert driver_info(os.path.join(stub_dir, 'libcuda.so.1')) == {
        'found': True, 'cuda_version': None, 'gpus': [],
        'errors': ['cuDriverGetVersion: error 100 (CUDA_ERROR_NO_DEVICE)',
                   'cuInit: error 100 (CUDA_ERROR_NO_DEVICE)']}


def test_the_report_lists_each_gpu_and_the_fusion_advice(one_gpu_stub):
    from gluon_mgpu.commands import env
    info = env.collect()
    info.update(features=info['features'] + ['CUDA'], kernel_module='470.82.01',
                driver=driver_info(one_gpu_stub))
    lines = format_report(info).splitlines()
    assert 'NVIDIA driver: kernel module 470.82.01, for CUDA 11.4' in lines
    assert ("  MXNet's fused kernels (compiled by NVRTC 11.8) need a driver for CUDA 11.8 "
            "(>= 520): update the driver or set MXNET_USE_FUSION=0") in lines
    assert 'GPUs:         1 seen by the driver, 0 by MXNet' in lines
    assert '  gpu(0): Stand-in GPU, 16.0 GiB' in lines
