#!/usr/bin/env bash
# make demo: a three-node cluster end to end (see scripts/demo.py).
set -euo pipefail
exec python scripts/demo.py
