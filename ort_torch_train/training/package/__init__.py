"""Packages of steps compiled ahead of time (AOTInductor): built by ``build.py``, run by ``packaged.py``."""
