from setuptools import find_packages, setup

setup(
    name='gluon_mgpu',
    version='0.1.0',
    description='The d2l chapter "Gluon Implementation for Multi-GPU Computation", '
                'runnable with or without GPUs',
    packages=find_packages(include=['gluon_mgpu', 'gluon_mgpu.*']),
    python_requires='>=3.9,<3.12',
    # MXNet itself is not listed: the CPU wheel (mxnet) and the GPU wheel (mxnet-cu112) are
    # different distributions of the same module, and listing one would pull it in on top of
    # the other. requirements.txt / requirements-gpu.txt choose.
    install_requires=['numpy==1.23.5'],
    extras_require={'test': ['pytest', 'd2lzh==1.0.0', 'nbformat', 'nbconvert', 'ipykernel']},
)
