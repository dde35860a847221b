"""A policy probe for ``tests/test_mcp_effects.py``: does the effect service at argv[1]
have a server called web1? Exit 0 if it has, 1 if not."""

import json
import sys
import urllib.request

with urllib.request.urlopen(f"{sys.argv[1]}/servers?name=web1", timeout=30) as r:
    sys.exit(0 if json.load(r)["servers"] else 1)
