"""The one exception hierarchy, re-exported for users.

It lives in ``recorder`` because the dependency direction (docs/architecture.md) makes the
recorder the bottom layer; everything above may import it.
"""

from stenograph.recorder.errors import *  # noqa: F403
from stenograph.recorder.errors import __all__  # noqa: F401
