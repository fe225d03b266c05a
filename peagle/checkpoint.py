"""Head directories, whatever their kind: read, write, recognise, resolve, load and save.

A head directory is ``config.json`` + ``model.safetensors`` in the layout serving engines load.
What the files hold is the kind's business (:mod:`peagle.kinds`): the EAGLE-3 layout of P-EAGLE
and EAGLE-3 heads is ``peagle/drafters/eagle_format.py``, DFlash's ``peagle/drafters/dflash/format.py``.
This module holds what every kind shares -- the safetensors and config.json I/O, recognising the
kind of a directory (:func:`detect_kind`), shipped head names (:func:`resolve`) -- and the entry
points that dispatch to the kind: :func:`save_pretrained`, :func:`from_pretrained`,
:func:`load_drafter`. It imports no kind.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from . import kinds
from .int8 import is_int8

WEIGHTS = "model.safetensors"
HEADS_DIR = Path(__file__).parent / "heads"


class CheckpointError(ValueError):
    """A head directory that is incomplete, corrupt, or does not match its config or target."""


# -- files -----------------------------------------------------------------------------------
def canonical_name(name: str) -> str:
    """Original EAGLE-3 / prefixed names -> peagle's (``midlayer.x`` -> ``layers.0.x``)."""
    for prefix in ("model.", "module."):
        if name.startswith(prefix) and not name.startswith("model.safetensors"):
            name = name[len(prefix):]
    if name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer."):]
    return name


def _unused_by_engines(name: str) -> bool:
    """vLLM gives every layer a hidden_norm but only layer 0 reads it: such weights are dropped."""
    return name.startswith("layers.") and name.endswith(".hidden_norm.weight") and not name.startswith("layers.0.")


def _open_safetensors(path: Path):
    from safetensors import safe_open

    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (a head directory holds config.json and {WEIGHTS})")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc


def tensor_names(path: str | Path) -> set[str]:
    """Canonical names of the tensors in a safetensors file (nothing read but the header)."""
    with _open_safetensors(Path(path)) as f:
        return {canonical_name(k) for k in f.keys()}


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file under canonical names; names the tensor that fails to read."""
    path = Path(path)
    out = {}
    with _open_safetensors(path) as f:
        for key in f.keys():
            if _unused_by_engines(canonical_name(key)):
                continue
            try:
                out[canonical_name(key)] = f.get_tensor(key)
            except Exception as exc:
                raise CheckpointError(f"{path}: tensor `{key}` could not be read ({exc})") from exc
    return out


def write_head_dir(path: str | Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``path``, each atomically and readable
    by others (0644: safetensors writes 0600, and engines and other users read heads)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)
    os.replace(tmp, path / WEIGHTS)
    (path / "config.json.tmp").write_text(json.dumps(config, indent=2) + "\n")
    os.chmod(path / "config.json.tmp", 0o644)
    os.replace(path / "config.json.tmp", path / "config.json")
    return path


def read_config(path: str | Path, error: type[ValueError] | None = None) -> dict:
    """The config.json of a head directory, with errors that name the file (``error``: the
    exception class for invalid JSON, default CheckpointError)."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} does not exist: a head directory holds config.json and {WEIGHTS}")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise (error or CheckpointError)(f"{cfg_path} is not valid JSON: {exc}") from exc



# -- kinds ---------------------------------------------------------------------------------------
def detect_kind(cfg_dict: dict, tensor_names) -> kinds.HeadKind:
    """The kind of a head directory from its config.json and its tensor names.

    peagle's own key ``peagle.drafter`` wins; otherwise the kinds saved under the config's
    architecture name (or, for a name no kind uses, the kinds that accept unknown names) are
    asked in registration order.
    """
    registered = kinds.all_kinds()
    own = (cfg_dict.get("peagle") or {}).get("drafter")
    if own is not None:
        if own not in kinds.names():
            raise CheckpointError(f"config.json names the head kind {own!r}; this peagle knows {', '.join(kinds.names())}")
        return kinds.get(own)
    archs = set(cfg_dict.get("architectures") or ())
    named = [k for k in registered if archs & set(k.architectures)]
    candidates = named or [k for k in registered if k.recognises_unknown_architectures]
    names_set = set(tensor_names)
    for kind in candidates:
        if kind.claims(cfg_dict, names_set):
            return kind
    raise CheckpointError(f"config.json architectures {sorted(archs)} match no head kind ({', '.join(kinds.names())})")


def kind_of_dir(path: str | Path, cfg_dict: dict | None = None) -> kinds.HeadKind:
    """The registered kind of the head in directory ``path`` (config.json + the tensor names)."""
    path = Path(path)
    cfg_dict = read_config(path) if cfg_dict is None else cfg_dict
    weights = path / WEIGHTS
    return detect_kind(cfg_dict, tensor_names(weights) if weights.exists() else set())


def save_pretrained(head, path: str | Path, **options) -> Path:
    """Write ``head`` to the directory ``path`` in its kind's layout (``config.json`` + weights).

    P-EAGLE / EAGLE-3 heads take the options of :func:`peagle.drafters.eagle_format.save_eagle_layout`.
    """
    if is_int8(head):
        raise ValueError("this head has int8 drafting weights (peagle.quantize_int8), which drop the float "
                         "weights a checkpoint holds: save the head before quantising it")
    return kinds.of(head).save(head, path, **options)


def from_pretrained(path: str | Path, target=None, dtype: torch.dtype | None = None, device=None):
    """Load a head directory of any registered kind (ours, speculators', original EAGLE-3, ...)."""
    path = Path(path)
    cfg_dict = read_config(path)
    return kind_of_dir(path, cfg_dict).load(path, cfg_dict, target=target, dtype=dtype, device=device)


def resolve(name_or_path: str | Path) -> Path:
    """The head directory of a shipped head's name ("peagle", "eagle3", ...: ``peagle/heads/NAME``) or a path.

    A shipped name wins over a same-named directory that is not a head (from the repository root,
    "peagle" is also the package's folder).
    """
    if (Path(name_or_path) / "config.json").exists():
        return Path(name_or_path)
    shipped = HEADS_DIR / str(name_or_path)
    if str(name_or_path) in kinds.names():
        if not (shipped / "config.json").exists():
            raise FileNotFoundError(
                f"no shipped `{name_or_path}` head at {shipped}: the heads for the embedded model are not trained "
                "yet (scripts/train_embedded.sh builds them); pass a head directory instead")
        return shipped
    return Path(name_or_path)


def load_drafter(name_or_path: str | Path, target=None, dtype: torch.dtype | None = None, device=None,
                 expect: type | None = None):
    """A trained head: "peagle" / "eagle3" (shipped for the embedded SmolLM2) or a head directory.

    ``target`` (optional) checks compatibility and rebuilds a compact embedding table; heads
    shipped for the embedded model rebuild it from the embedded model without one. ``expect``: a
    drafter class the head must be (ValueError naming the kind found otherwise).
    """
    path = resolve(name_or_path)
    cfg_dict = read_config(path)
    kind = kind_of_dir(path, cfg_dict)
    if expect is not None and not issubclass(kind.drafter_class, expect):
        raise ValueError(f"{name_or_path} holds a {kind.name} head ({kind.drafter_class.__name__}), not a "
                         f"{expect.__name__}: load it with {kind.drafter_class.__name__}.from_pretrained or "
                         "peagle.load_drafter")
    return kind.load(path, cfg_dict, target=target, dtype=dtype, device=device)
