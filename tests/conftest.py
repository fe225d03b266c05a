import os
import sys

import pytest
import torch

# Triton must see this before its first import: without a GPU the suite runs kernels in the
# interpreter; with one (tests/gpu) they must compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(__file__))
# One thread: tiny test models gain nothing from two, and parallel jobs contend for the cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread():
    """A test that changes the thread count (a CLI's --threads) must not leak it into the next."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
