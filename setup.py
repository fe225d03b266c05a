"""The one build setting pyproject.toml cannot hold: the package list.

Every package under peagle/ (any folder with an __init__.py, so new subpackages need no edit here),
plus ``peagle.kernels``, which lives in the top-level kernels/ folder (``package-dir`` in
pyproject.toml maps it); ``[tool.setuptools.packages.find]`` only names packages by the folders it
finds, so it cannot add that one. All other metadata is in pyproject.toml.
"""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["peagle", "peagle.*"]), "peagle.kernels"])
