"""Fused kernels for peagle, each with a PyTorch twin and a dispatcher.

Imported as ``peagle.kernels`` (setuptools maps this folder there; it is never a top-level
``kernels`` module). ``import triton`` happens only inside the kernel modules, and nothing here
probes CUDA at import time.
"""
