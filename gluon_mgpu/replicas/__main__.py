"""``python -m gluon_mgpu.replicas``: the command line is ``gluon_mgpu/commands/replicas.py``
(docs/replicas.md).
"""
import sys

from gluon_mgpu.commands.replicas import main

sys.exit(main())
