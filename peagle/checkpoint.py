"""Saving and loading draft heads in the layout serving engines load (method.md section 4).

A head directory is ``config.json`` + ``model.safetensors``::

    config.json   architectures ["LlamaForCausalLMEagle3"], the Llama fields, draft_vocab_size,
                  target_hidden_size, eagle_aux_hidden_state_layer_ids, and for P-EAGLE both
                  mask_token_id and ptd_token_id; peagle's own keys live under "peagle".
    tensors       fc.weight [H, A]; layers.{i}.self_attn.{q,k,v,o}_proj.weight;
                  layers.{i}.mlp.{gate,up,down}_proj.weight; layers.{i}.{input,post_attention}_layernorm.weight;
                  layers.0.hidden_norm.weight; norm.weight; lm_head.weight [N, H]; d2t int64 [N];
                  t2d bool [V]; P-EAGLE: mask_hidden [1, 1, A], embed_tokens.weight [V, H].

Original EAGLE-3 checkpoints name layer 0 ``midlayer.*``; they load too. The *compact* form kept in
this repository stores only the embedding rows that differ from the target's
(``embed_tokens.rows`` int64 [R], ``embed_tokens.row_values`` [R, H]) and rebuilds the table from
the target on load; ``peagle export`` always writes the full table.

Which kind a directory holds, and how that kind is saved and loaded, is the registry's business
(:mod:`peagle.kinds`): :func:`save_pretrained`, :func:`from_pretrained` and :func:`load_drafter`
work for every registered kind; the EAGLE-3-layout functions below serve P-EAGLE and EAGLE-3.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from . import kinds
from .config import DrafterConfig
from .dtypes import dtype_name
from .kinds import MASK_TOKEN_KEYS

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
HEADS_DIR = Path(__file__).parent / "heads"
COMPACT_ROWS, COMPACT_VALUES = "embed_tokens.rows", "embed_tokens.row_values"


class CheckpointError(ValueError):
    """A head directory that is incomplete, corrupt, or does not match its config or target."""


# -- config ----------------------------------------------------------------------------------
def config_to_dict(cfg: DrafterConfig, kind, dtype: torch.dtype, compact: bool = False,
                   target_name: str | None = None) -> dict:
    """The config.json of a head: Llama fields + EAGLE-3 keys (+ the kind's, e.g. P-EAGLE's mask token keys)."""
    kind = kinds.get(kind)
    d = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)},
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name(dtype),
    }
    d.update(kind.extra_config(cfg))
    d["peagle"] = {"format_version": 1, "drafter": kind.name, "max_draft_k": cfg.max_draft_k,
                   "compact_embedding": compact, "target": target_name, **cfg.extra}
    return d


UNSUPPORTED_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "attention_bias")


def config_from_dict(d: dict, target=None) -> DrafterConfig:
    """The DrafterConfig of an EAGLE-3-layout config.json dict (its kind: :func:`peagle.kinds.detect`)."""
    own = d.get("peagle", {}) or {}
    # vLLM honours these flags; peagle's layers implement only their default (off), so a head
    # that sets one would draft differently here than in the engine: refuse it.
    unsupported = [k for k in UNSUPPORTED_FLAGS if d.get(k)]
    if d.get("logit_scale") not in (None, 1, 1.0):
        unsupported.append("logit_scale")
    if unsupported:
        raise CheckpointError(f"config.json sets {', '.join(unsupported)}: peagle implements only the default "
                              "(false) of these EAGLE-3 variants")
    try:
        H = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        vocab = int(d["vocab_size"])
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks the required field {exc.args[0]!r}") from None
    aux = d.get("eagle_aux_hidden_state_layer_ids") or (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is None:
        if target is None:
            raise CheckpointError("config.json has no eagle_aux_hidden_state_layer_ids: pass target= to use its defaults")
        aux = target.aux_layer_ids
    mask_id = next((d[k] for k in MASK_TOKEN_KEYS if d.get(k) is not None), None)
    rope_theta = d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    cfg = DrafterConfig(
        hidden_size=H, num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or H // heads),
        intermediate_size=int(d["intermediate_size"]), vocab_size=vocab,
        draft_vocab_size=int(d.get("draft_vocab_size") or vocab),
        target_hidden_size=int(d.get("target_hidden_size") or H),
        aux_layer_ids=tuple(aux), num_layers=int(d.get("num_hidden_layers", 1)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)), rope_theta=float(rope_theta),
        max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
        mask_token_id=None if mask_id is None else int(mask_id),
        max_draft_k=int(own.get("max_draft_k", 16)),
    )
    return cfg


# -- tensor names and checks --------------------------------------------------------------------
def expected_shapes(cfg: DrafterConfig, kind) -> dict[str, tuple[int, ...]]:
    """Every tensor a complete head must hold, with its shape (embed_tokens excluded)."""
    H, A, D = cfg.hidden_size, cfg.aux_hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    shapes = {"fc.weight": (H, A), "norm.weight": (H,), "lm_head.weight": (cfg.draft_vocab_size, H),
              "d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)}
    for i in range(cfg.num_layers):
        p, inp = f"layers.{i}.", 2 * H if i == 0 else H
        shapes.update({
            p + "self_attn.q_proj.weight": (q, inp), p + "self_attn.k_proj.weight": (kv, inp),
            p + "self_attn.v_proj.weight": (kv, inp), p + "self_attn.o_proj.weight": (H, q),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, H), p + "mlp.up_proj.weight": (cfg.intermediate_size, H),
            p + "mlp.down_proj.weight": (H, cfg.intermediate_size),
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
        })
    shapes["layers.0.hidden_norm.weight"] = (H,)
    shapes.update(kinds.get(kind).extra_shapes(cfg))
    return shapes


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


def validate_tensors(tensors: dict[str, torch.Tensor], cfg: DrafterConfig, kind,
                     require_embedding: bool = False) -> None:
    """Raise CheckpointError naming each missing, unexpected or misshapen tensor."""
    shapes = expected_shapes(cfg, kind)
    optional = {"embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), COMPACT_ROWS: None, COMPACT_VALUES: None}
    problems = []
    missing = [n for n in shapes if n not in tensors and not (n == "t2d" and "d2t" in tensors)]
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if require_embedding and "embed_tokens.weight" not in tensors:
        problems.append("missing tensor: embed_tokens.weight (the full trained table)")
    unknown = [n for n in tensors if n not in shapes and n not in optional]
    if unknown:
        problems.append(f"unexpected tensors: {', '.join(unknown)}")
    for name, t in tensors.items():
        want = shapes.get(name) or optional.get(name)
        if name == "mask_hidden" and t.numel() == cfg.aux_hidden_size:
            continue  # [A] or [1, 1, A]: engines accept either
        if want is not None and tuple(t.shape) != tuple(want):
            problems.append(f"tensor `{name}` has shape {tuple(t.shape)}, expected {tuple(want)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            problems.append(f"tensor `{name}` holds non-finite values")
    if COMPACT_ROWS in tensors:
        rows, values = tensors[COMPACT_ROWS], tensors.get(COMPACT_VALUES)
        if values is None or values.shape != (rows.numel(), cfg.hidden_size):
            problems.append(f"tensor `{COMPACT_VALUES}` must have shape ({rows.numel()}, {cfg.hidden_size})")
        elif rows.numel() and not 0 <= int(rows.min()) <= int(rows.max()) < cfg.vocab_size:
            problems.append(f"tensor `{COMPACT_ROWS}` holds ids outside [0, {cfg.vocab_size})")
    if "d2t" in tensors and tensors["d2t"].shape == (cfg.draft_vocab_size,):
        ids = torch.arange(cfg.draft_vocab_size) + tensors["d2t"].long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size or bool((ids[1:] <= ids[:-1]).any())):
            problems.append(f"tensor `d2t` does not map draft ids to ascending target ids in [0, {cfg.vocab_size})")
        elif "t2d" in tensors and tensors["t2d"].shape == (cfg.vocab_size,):
            t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
            t2d[ids] = True
            if not torch.equal(t2d, tensors["t2d"].bool()):
                problems.append("tensor `t2d` disagrees with `d2t`")
    if problems:
        raise CheckpointError("; ".join(problems))


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


# -- save ------------------------------------------------------------------------------------
def plain_state_dict(head) -> dict[str, torch.Tensor]:
    """``head.state_dict()`` with each parametrised tensor (torch.nn.utils.parametrize, as training's
    preconditioner uses) under its plain name and effective value, the form engines load."""
    from torch.nn.utils import parametrize

    out = {k: v for k, v in head.state_dict().items() if "parametrizations." not in k}
    for mod_name, mod in head.named_modules():
        if parametrize.is_parametrized(mod):
            for pname in mod.parametrizations:
                out[f"{mod_name}.{pname}" if mod_name else pname] = getattr(mod, pname).detach()
    return out


def head_tensors(head, full_embedding: bool = True, reference_embedding: torch.Tensor | None = None,
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a head under engine names; the embedding full, compact or absent."""
    state = {}
    for name, t in plain_state_dict(head).items():
        if name.startswith("embed_tokens.") or name.startswith("_target_embed"):
            continue
        t = t.detach().cpu()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        state[name] = t.contiguous()
    table = head.embed_tokens.weight.detach().cpu() if getattr(head, "embed_tokens", None) is not None else None
    if table is not None and kinds.of(head).trains_embedding:
        table = table.to(dtype) if dtype is not None else table
        if full_embedding:
            state["embed_tokens.weight"] = table.contiguous()
        else:
            if reference_embedding is None:
                raise ValueError("the compact form needs the target's embedding table (reference_embedding=)")
            ref = reference_embedding.detach().cpu().to(table.dtype)
            rows = (table != ref).any(dim=1).nonzero().flatten()
            state[COMPACT_ROWS] = rows.to(torch.long)
            state[COMPACT_VALUES] = table[rows].contiguous()
    return state


def save_pretrained(head, path: str | Path, **options) -> Path:
    """Write ``head`` to the directory ``path`` in its kind's layout (``config.json`` + weights).

    P-EAGLE / EAGLE-3 heads take the options of :func:`save_eagle_layout`.
    """
    return kinds.of(head).save(head, path, **options)


def save_eagle_layout(head, path: str | Path, kind=None, *, compact: bool = False, target=None,
                      reference_embedding: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                      target_name: str | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (atomically: a temporary name, then a rename).

    compact: store only the embedding rows that differ from the target's (pass target= or
    reference_embedding=); the default writes the full table, as engines need.
    """
    path = Path(path)
    kind = kinds.of(head) if kind is None else kinds.get(kind)
    compact = compact and kind.trains_embedding  # only a trained table is stored (compactly or not)
    if compact and reference_embedding is None:
        if target is None:
            raise ValueError("save_pretrained(compact=True) needs target= or reference_embedding=")
        reference_embedding = target.input_embeddings().weight
    tensors = head_tensors(head, full_embedding=not compact, reference_embedding=reference_embedding, dtype=dtype)
    validate_tensors(tensors, head.config, kind)
    if head.config.draft_vocab_size == head.config.vocab_size:
        # N == V: the mapping is the identity, which the absence of d2t means to peagle and vLLM;
        # vLLM has no draft_id_to_target_id parameter then and refuses a head that carries one.
        tensors.pop("d2t", None)
        tensors.pop("t2d", None)
    out_dtype = dtype or head.fc.weight.dtype
    config = config_to_dict(head.config, kind, out_dtype, compact=compact, target_name=target_name)
    return write_head_dir(path, tensors, config)


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


# -- load ------------------------------------------------------------------------------------
def _embedded_table() -> torch.Tensor:
    """The embedded SmolLM2's input embedding table, read from its converted safetensors."""
    from safetensors import safe_open

    from .embedded import embedded_model_dir

    file = embedded_model_dir() / "model.safetensors"
    with safe_open(str(file), framework="pt") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        return f.get_tensor(key)


def _reference_table(target, cfg_dict: dict) -> torch.Tensor:
    if target is not None:
        return target.input_embeddings().weight.detach().cpu()
    name = (cfg_dict.get("peagle") or {}).get("target")
    if name in ("default", "embedded"):
        return _embedded_table()
    raise CheckpointError("this head stores its embedding in compact form (only the rows that differ from the "
                          f"target's): pass target= to rebuild the table (head trained for target {name!r})")


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


def kind_of_dir(path: str | Path, cfg_dict: dict | None = None) -> kinds.HeadKind:
    """The registered kind of the head in directory ``path`` (config.json + the tensor names)."""
    path = Path(path)
    cfg_dict = read_config(path) if cfg_dict is None else cfg_dict
    weights = path / WEIGHTS
    return kinds.detect(cfg_dict, tensor_names(weights) if weights.exists() else set())


def from_pretrained(path: str | Path, target=None, dtype: torch.dtype | None = None, device=None):
    """Load a head directory of any registered kind (ours, speculators', original EAGLE-3, ...)."""
    path = Path(path)
    cfg_dict = read_config(path)
    return kind_of_dir(path, cfg_dict).load(path, cfg_dict, target=target, dtype=dtype, device=device)


def load_eagle_layout(path: str | Path, cfg_dict: dict, kind, target=None, dtype: torch.dtype | None = None,
                      device=None):
    """An EAGLE-3-layout head directory as a drafter of ``kind`` (PEagleDrafter / Eagle3Drafter)."""
    path = Path(path)
    kind = kinds.get(kind)
    cfg = config_from_dict(cfg_dict, target)
    tensors = read_tensors(path / WEIGHTS)
    if cfg.draft_vocab_size == cfg.vocab_size and "d2t" not in tensors:
        tensors["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.long)
    validate_tensors(tensors, cfg, kind)
    if target is not None:
        cfg.check_target(target, error=CheckpointError)
    head = kind.build(cfg)
    float_dtype = dtype or tensors["fc.weight"].dtype
    head.to(float_dtype)
    table = tensors.pop("embed_tokens.weight", None)
    if COMPACT_ROWS in tensors:
        rows, values = tensors.pop(COMPACT_ROWS), tensors.pop(COMPACT_VALUES)
        table = _reference_table(target, cfg_dict).clone().to(values.dtype)
        if table.shape != (cfg.vocab_size, cfg.hidden_size):
            raise CheckpointError(f"the target's embedding table has shape {tuple(table.shape)}, expected {(cfg.vocab_size, cfg.hidden_size)}")
        table[rows] = values
    if "t2d" not in tensors:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.draft_vocab_size) + tensors["d2t"].long()] = True
        tensors["t2d"] = t2d
    tensors["d2t"] = tensors["d2t"].long()
    tensors["t2d"] = tensors["t2d"].bool()
    if "mask_hidden" in tensors:
        tensors["mask_hidden"] = tensors["mask_hidden"].reshape(1, 1, -1)
    result = head.load_state_dict({k: v for k, v in tensors.items()}, strict=False)
    if result.missing_keys or result.unexpected_keys:  # validate_tensors should have caught these
        raise CheckpointError(f"missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    if table is not None:
        head.embed_tokens = torch.nn.Embedding.from_pretrained(table.to(float_dtype), freeze=not kind.trains_embedding)
    if device is not None:
        head.to(device)
    return head


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
