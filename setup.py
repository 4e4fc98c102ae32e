import os
import re

from setuptools import find_packages, setup

# The version is gluon_mgpu/_version.py's, read as text: importing the package would start it.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'gluon_mgpu',
                       '_version.py')) as f:
    VERSION = re.search(r"__version__ = '([^']+)'", f.read())[1]

setup(
    name='gluon_mgpu',
    version=VERSION,
    description='The d2l chapter "Gluon Implementation for Multi-GPU Computation", '
                'runnable with or without GPUs',
    packages=find_packages(include=['gluon_mgpu', 'gluon_mgpu.*']),
    python_requires='>=3.9,<3.12',
    # MXNet itself is not listed: the CPU wheel (mxnet) and the GPU wheel (mxnet-cu112) are
    # different distributions of the same module, and listing one would pull it in on top of
    # the other. requirements.txt / requirements-gpu.txt choose.
    # What the package imports besides MXNet: the progress bar (tqdm) and --plot (matplotlib,
    # whose contourpy must still accept numpy 1.23.5).
    install_requires=['numpy==1.23.5', 'tqdm>=4.60', 'matplotlib>=3.7,<3.11', 'contourpy<1.3.3'],
    extras_require={'test': ['pytest', 'd2lzh==1.0.0', 'nbformat', 'nbconvert', 'ipykernel'],
                    # benchmarks/run.py's PyTorch rows only; never needed to train.
                    'bench': ['torch==2.13.0']},
)
