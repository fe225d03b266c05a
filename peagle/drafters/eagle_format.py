"""The EAGLE-3 head directory, shared by P-EAGLE and EAGLE-3 heads (docs/training.md), and
:class:`EagleKind`, the part of a head kind both share.

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
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import kinds
from ..checkpoint import WEIGHTS, CheckpointError, read_tensors, write_head_dir
from ..config import DrafterConfig
from ..dtypes import dtype_name
from ..embedded import embedded_model_dir

ARCHITECTURE = "LlamaForCausalLMEagle3"
MASK_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")  # the order engines look them up
COMPACT_ROWS, COMPACT_VALUES = "embed_tokens.rows", "embed_tokens.row_values"


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
    if cfg.attention_window is not None:  # peagle's own: engines attend over the whole context
        d["peagle"]["attention_window"] = cfg.attention_window
    return d


UNSUPPORTED_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "attention_bias")


def config_from_dict(d: dict, target=None) -> DrafterConfig:
    """The DrafterConfig of an EAGLE-3-layout config.json dict (its kind: :func:`peagle.checkpoint.detect_kind`)."""
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
        attention_window=None if own.get("attention_window") is None else int(own["attention_window"]),
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
    if table is not None and head.trains_embedding:
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



# -- load ------------------------------------------------------------------------------------
def _embedded_table() -> torch.Tensor:
    """The embedded SmolLM2's input embedding table, read from its converted safetensors."""
    from safetensors import safe_open

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


def expand_compact_embedding(tensors: dict[str, torch.Tensor], cfg_dict: dict, target=None) -> dict[str, torch.Tensor]:
    """``tensors`` with a compact embedding (``embed_tokens.rows`` + ``row_values``) replaced by the
    full table ``embed_tokens.weight`` [V, H], rebuilt from the target's (``target=`` or the embedded
    SmolLM2 when the head names it); tensors without one are returned as they are."""
    if COMPACT_ROWS not in tensors:
        return tensors
    out = dict(tensors)
    rows, values = out.pop(COMPACT_ROWS), out.pop(COMPACT_VALUES)
    table = _reference_table(target, cfg_dict).clone().to(values.dtype)
    vocab, hidden = int(cfg_dict.get("vocab_size", table.shape[0])), int(cfg_dict.get("hidden_size", table.shape[1]))
    if table.shape != (vocab, hidden):
        raise CheckpointError(f"the target's embedding table has shape {tuple(table.shape)}, expected {(vocab, hidden)}")
    table[rows] = values
    out["embed_tokens.weight"] = table
    return out


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
    tensors = expand_compact_embedding(tensors, cfg_dict, target)
    table = tensors.pop("embed_tokens.weight", None)
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


# -- the kind ----------------------------------------------------------------------------------
class EagleKind(kinds.HeadKind):
    """Heads in the EAGLE-3 layout (this module): P-EAGLE and EAGLE-3 subclass it."""

    architectures = (ARCHITECTURE, "Eagle3LlamaForCausalLM")
    recognises_unknown_architectures = True

    @property
    def config_class(self) -> type:
        return DrafterConfig

    @property
    def trains_embedding(self) -> bool:
        """The head trains (and so saves) its own embedding table."""
        return bool(getattr(self.drafter_class, "trains_embedding", False))

    def extra_config(self, cfg) -> dict:
        """Kind-specific config.json keys."""
        return {}

    def extra_shapes(self, cfg) -> dict[str, tuple[int, ...]]:
        """Kind-specific tensors a complete head holds, with their shapes."""
        return {}

    def save(self, head, path, **options) -> Path:
        return save_eagle_layout(head, path, self, **options)

    def load(self, path, cfg_dict, target=None, dtype=None, device=None):
        return load_eagle_layout(path, cfg_dict, self, target=target, dtype=dtype, device=device)
