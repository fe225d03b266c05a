"""The top-level kernels/ folder must not break transformers when the repository root is on sys.path."""
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
import transformers
transformers.LlamaConfig  # imports transformers.integrations.hub_kernels, which imports `kernels`
import kernels
import peagle.kernels
print(json.dumps({"kernels": kernels.__file__, "peagle_kernels": peagle.kernels.__file__,
                  "tree_verify": hasattr(peagle.kernels, "tree_verify"),
                  "stray": "kernels._hand_over" in sys.modules}))
"""


def _run_from_root() -> dict:
    # `python -c` puts the working directory first on sys.path, as `python -m` and notebooks do.
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_repository_root_on_sys_path_keeps_transformers_and_peagle_kernels_working():
    found = _run_from_root()
    assert found["tree_verify"]
    assert Path(found["peagle_kernels"]).resolve() == ROOT / "kernels" / "__init__.py"
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return  # no Hugging Face `kernels` installed: the folder may answer to the name
    # Installed: `import kernels` must give that package, not this repository's folder.
    assert Path(found["kernels"]).resolve() != ROOT / "kernels" / "__init__.py"
    assert not found["stray"]
