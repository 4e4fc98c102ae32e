"""``python -m gluon_mgpu.train``: runs ``gluon_mgpu/commands/train.py`` (docs/outputs.md)."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.commands.train import main
    sys.exit(main())
