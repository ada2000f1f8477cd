"""Where the course key of the secret seed lies (grader/inputs.py makes and reads it; the jail
keeps its folder out of every child's view, grader/sandbox.py)."""
from __future__ import annotations

import os

KEY_ENV = "GRADER_SEED_KEY_FILE"


def seed_key_path() -> str:
    """``GRADER_SEED_KEY_FILE``, or ``~/.config/modern-gpu-kernels/seed.key``."""
    return os.environ.get(KEY_ENV) or os.path.join(os.path.expanduser("~"), ".config", "modern-gpu-kernels",
                                                   "seed.key")
