"""``python -m gluon_mgpu.env``: runs ``gluon_mgpu/commands/env.py`` (docs/gpu.md)."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.commands.env import main
    sys.exit(main())
