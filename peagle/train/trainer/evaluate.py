"""Held-out evaluation of a trained head: KL, top-1 agreement and greedy acceptance by depth.

Why acceptance can be read off teacher-forced passes: the data are the target's own greedy
answers, so greedy verification accepts the draft at depth d from anchor a iff it equals the
answer's token there and every shallower draft was accepted. P-EAGLE's depth-d input never reads
earlier drafts (mask slots), and EAGLE-3's reads the true tokens, which equal its drafts on an
accepted prefix. So the longest correct prefix per anchor is what ``generate`` would accept on
these sequences (up to the numerics of cached vs decode-time features), in minutes instead of
the hour a decoding run takes, and on shards the head never trained on (``--shards``).

    peagle train evaluate --head runs/peagle/final --data runs/data --shards 12-13 --draft-k 7
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ... import kinds
from ...checkpoint import from_pretrained
from ...embedded import load_target_by_name
from ...machine import apply_threads
from .. import kinds as train_kinds
from ..data.held_out import contaminated_prompts
from ..data.shards import parse_shards
from ..packed.forward import StepStats
from .batches import TrainSet, micro_batches

CONTEXT_BINS = (0, 512, 1024, 2048, 4096)  # acceptance is also reported per bin of tokens before the anchor


@dataclass
class HeldOutResult:
    """Per-depth means over supervised elements, and the greedy acceptance they imply."""

    head: str
    kind: str  # the head's kind (peagle.kinds): "peagle", "eagle3", "dflash"
    shards: str | None
    draft_k: int
    sequences: int
    answer_tokens: int
    kl_by_depth: list[float]  # KL(target || draft) over the draft vocabulary (DFlash: the full vocabulary)
    agreement_by_depth: list[float]  # P(draft argmax == the answer's token), unconditional
    acceptance_by_position: list[float]  # P(positions 1..j all accepted), anchors with draft_k depths
    acceptance_length: float  # 1 + sum(acceptance_by_position): tokens per target pass
    anchors: int  # anchors behind acceptance_length
    # Per context bin (tokens before the anchor, CONTEXT_BINS): {"context": "512-1023", "anchors": n,
    # "acceptance_length": x}; bins without anchors are left out.
    acceptance_by_context: list[dict] = field(default_factory=list)
    skipped: int = 0  # held-out sequences left out: a committed training directory answers the same request

    def table(self) -> str:
        rows = ["| depth | KL | agreement | P(accepted through here) |", "|---|---|---|---|"]
        for d in range(self.draft_k):
            rows.append(f"| {d + 1} | {self.kl_by_depth[d]:.3f} | {self.agreement_by_depth[d]:.3f} | "
                        f"{self.acceptance_by_position[d]:.3f} |")
        by_context = ", ".join(f"{b['context']}: {b['acceptance_length']:.3f} ({b['anchors']})"
                               for b in self.acceptance_by_context)
        return ("\n".join(rows) + f"\nacceptance length {self.acceptance_length:.3f} over {self.anchors} anchors"
                + (f"\nby context tokens (anchors): {by_context}" if by_context else "")
                + (f"\nleft out {self.skipped} sequences whose request training data also answers" if self.skipped else ""))


def evaluate_head(head, target, data_dir: str | Path, shards: str | None = None, draft_k: int | None = None,
                  max_len: int = 1024, micro_batch_tokens: int = 4096, max_sequences: int | None = None,
                  show_progress: bool = True, head_name: str = "", eval_options: dict | None = None,
                  features: str = "cache", skip_trained: bool = True) -> HeldOutResult:
    """Evaluate ``head`` (a trained head of a trainable kind) on the answers of ``data_dir``.

    features: "cache" reads ``DATA/features`` (``peagle train features``); "online" runs the target
    over each micro-batch instead (no cache on disk; one target pass per head evaluated).

    draft_k: depths evaluated (default: the kind's, P-EAGLE's trained depth, 7 for EAGLE-3); must be
    in [1, max_draft_k]. Every chain is kept at every depth (no COD sampling).
    eval_options: keyword options of the kind's ``eval_step``, named in its ``eval_options``
    (DFlash: ``anchor_stride``).
    skip_trained: leave out the held-out prompts whose very request a committed training directory
    also answers (peagle.train.data.held_out.contaminated_prompts).
    """
    from tqdm.auto import tqdm

    try:
        kind = train_kinds.get(kinds.of(head).name)
    except ValueError:
        raise ValueError(f"head must be a trained head of kind {', '.join(train_kinds.names())}, "
                         f"got {type(head).__name__}") from None
    if max_sequences is not None and max_sequences < 1:
        raise ValueError(f"max_sequences must be >= 1 (or None for all), got {max_sequences}")
    K_max = int(head.config.max_draft_k)
    K = int(draft_k) if draft_k is not None else kind.eval_depth(head)
    if not 1 <= K <= K_max:
        raise ValueError(f"draft_k must be in [1, {K_max}] (the head's max_draft_k), got {draft_k}")
    eval_options = dict(eval_options or {})
    unknown = set(eval_options) - set(kind.eval_options)
    if unknown:
        raise ValueError(f"eval_options {sorted(unknown)} do not apply to {kind.name} heads")
    if features not in ("cache", "online"):
        raise ValueError(f"features must be 'cache' or 'online', got {features!r}")
    used_ids = kind.eval_vocab(head, target)
    head.bind(target)  # the target's embedding table (EAGLE-3, compact P-EAGLE heads) and the aux layers it reads
    data = TrainSet(data_dir, max_len, target, used_ids, features, shards,
                    skip_ids=contaminated_prompts() if skip_trained else frozenset())
    order = list(range(len(data)))[: max_sequences or None]
    lengths = [len(r[2]) for r in data.rows]
    head = head.float().eval()
    stats = StepStats(keep_elements=True)
    answer_tokens = 0
    bar = tqdm(total=len(order), unit="seq", desc=f"evaluate {kind.name}", disable=not show_progress, mininterval=5)
    accepted_sum, agree_sum = torch.zeros(K), torch.zeros(K)
    anchors = 0
    edges = torch.tensor(CONTEXT_BINS[1:])
    bin_accepted, bin_anchors = torch.zeros(len(CONTEXT_BINS)), torch.zeros(len(CONTEXT_BINS))
    with torch.no_grad():
        for mb in micro_batches(order, lengths, micro_batch_tokens):
            packed, feats = data.batch(mb, "cpu")
            stats.elements.clear()
            kind.eval_step(head, packed, feats, K, stats, **eval_options)
            anchor, depth, label, drafted = (torch.cat(t) for t in zip(*stats.elements))
            # The element predicts the token at row label + 1; the answer there is the target's greedy choice.
            ok = kind.drafted_to_target(head, drafted) == packed.input_ids[label + 1]
            keep = depth < K
            agree_sum.index_add_(0, depth[keep], ok[keep].float())
            # Acceptance: anchors with all K depths, longest all-correct prefix.
            grid = torch.zeros(int(packed.input_ids.numel()), K)
            have = torch.zeros(int(packed.input_ids.numel()), K, dtype=torch.bool)
            grid[anchor[keep], depth[keep]] = ok[keep].float()
            have[anchor[keep], depth[keep]] = True
            full = have.all(1)
            run = grid[full].cumprod(1)  # [anchors, K]: 1 through the last accepted position
            accepted_sum += run.sum(0)
            anchors += int(full.sum())
            rows = full.nonzero().squeeze(1)
            context = rows - packed.doc_start[packed.doc[rows]]  # tokens before the anchor in its sequence
            b = torch.bucketize(context, edges, right=True)
            bin_accepted.index_add_(0, b, run.sum(1))
            bin_anchors.index_add_(0, b, torch.ones_like(b, dtype=torch.float))
            answer_tokens += sum(len(data.rows[i][2]) - data.rows[i][3] for i in mb)
            bar.update(len(mb))
    bar.close()
    n = torch.tensor(stats.count[:K]).clamp_min(1)
    by_pos = (accepted_sum / max(anchors, 1)).tolist()
    return HeldOutResult(
        head=head_name, kind=kind.name, shards=shards, draft_k=K, sequences=len(order), answer_tokens=answer_tokens,
        kl_by_depth=(torch.tensor(stats.loss_sum[:K]) / n).tolist(), agreement_by_depth=(agree_sum / n).tolist(),
        acceptance_by_position=by_pos, acceptance_length=1.0 + sum(by_pos), anchors=anchors,
        acceptance_by_context=_by_context(bin_accepted, bin_anchors), skipped=data.dropped)


def _by_context(accepted: torch.Tensor, anchors: torch.Tensor) -> list[dict]:
    bounds = list(CONTEXT_BINS) + [None]
    return [{"context": f"{lo}-{hi - 1}" if hi else f"{lo}+", "anchors": int(n),
             "acceptance_length": 1.0 + float(a) / float(n)}
            for lo, hi, a, n in zip(bounds[:-1], bounds[1:], accepted.tolist(), anchors.tolist()) if n > 0]


def cli_target(args):
    """The target of ``peagle train evaluate``, loaded once its options are checked (here or with --suite)."""
    try:  # checked before the target loads
        parse_shards(args.shards)
    except ValueError as err:
        raise SystemExit(f"--shards: {err}")
    for name in ("draft_k", "max_sequences", "max_len", "anchor_stride"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    window = getattr(args, "attention_window", None)
    if window is not None and window < 0:
        raise SystemExit(f"--attention-window must be >= 0 (0: the whole context), got {window}")
    if (args.data is None) == (getattr(args, "suite", None) is None):
        raise SystemExit("give either --data DIR or --suite [SET ...]")
    apply_threads(args.threads or "auto")
    return load_target_by_name(args.target, args.target_dtype)


def stride_options(anchor_stride: int) -> dict:
    """``evaluate_head``'s eval_options for an anchor stride (none at 1, the stride every kind accepts)."""
    return {"anchor_stride": anchor_stride} if anchor_stride != 1 else {}


def load_eval_head(path, target, window: int | None = None):
    """The head at ``path`` bound to ``target``; ``window`` (the CLI's --attention-window) replaces its
    own attention window: None keeps the head's, 0 attends the whole context."""
    head = from_pretrained(path, target=target)
    if window is not None:
        if not hasattr(head, "set_attention_window"):
            raise SystemExit(f"--attention-window applies to EAGLE-3 / P-EAGLE heads, not {type(head).__name__}")
        head.set_attention_window(window or None)
    return head


def run_cli(args) -> int:
    """``peagle train evaluate --data DIR``: each head on held-out rows of one data directory."""
    target = cli_target(args)
    results = []
    for path in args.head:
        head = load_eval_head(path, target, getattr(args, "attention_window", None))
        options = stride_options(getattr(args, "anchor_stride", 1))
        res = evaluate_head(head, target, args.data, args.shards, args.draft_k, args.max_len,
                            max_sequences=args.max_sequences, head_name=str(path), eval_options=options,
                            features=args.features)
        print(f"\n{path} ({res.kind}, {res.sequences} sequences, {res.answer_tokens} answer tokens)\n{res.table()}")
        results.append(asdict(res))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    return 0

