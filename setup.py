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
    python_requires='>=3.9,<3.14',
    # MXNet itself is not listed: the CPU wheel (mxnet) and the GPU wheel (mxnet-cu112) are
    # different distributions of the same module, listing one would pull it in on top of the
    # other, and both ask for numpy<2 (the Makefile installs MXNet without its dependencies;
    # requirements.txt says why). What the package imports besides MXNet: numpy, the progress
    # bar (tqdm) and --plot (matplotlib).
    install_requires=['numpy>=2,<2.5', 'tqdm>=4.60', 'matplotlib>=3.9'],
    extras_require={'test': ['pytest', 'd2lzh==1.0.0', 'nbformat', 'nbconvert', 'ipykernel'],
                    # lab/run.py's PyTorch rows only; never needed to train.
                    'bench': ['torch==2.13.0']},
)
