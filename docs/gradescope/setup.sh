#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04 by
# default: Python 3.10, which symattn supports). Put it, run_autograder and problem.yaml at the
# root of the zip file you upload.
set -euo pipefail
apt-get install -y python3-pip
# Pin the version you tried the problem with (symattn --version), so the marking cannot change
# during the term: python3 -m pip install 'symattn==X.Y.Z'
python3 -m pip install symattn
