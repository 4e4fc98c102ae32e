"""The package's version, in one place: ``gluon_mgpu.__version__``, the records it writes, and
setup.py (which reads this file as text)."""
__version__ = '0.1.0'
