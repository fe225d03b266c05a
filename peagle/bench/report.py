"""Benchmark output: human tables (the seed article's layout first), CSV, PNG plots, one JSON line.

Seed layout, one table per (dataset, temperature), output tokens/s per concurrency:
    | Concurrency | P-EAGLE K=3 | K=7 | K=11 | EAGLE-3 K=3 | K=7 | K=11 | Baseline | P-EAGLE / EAGLE-3 | P-EAGLE / Baseline |
where the ratios compare the best P-EAGLE draft_k with the best EAGLE-3 draft_k (and with plain
decoding) at that concurrency.
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
from pathlib import Path
from statistics import median

from .arms import ARMS

CSV_FIELDS = ["dataset", "temperature", "batch_size", "arm", "label", "draft_k", "tree_nodes", "mean_draft_k", "mean_nodes", "otps",
              "speedup_vs_baseline", "acceptance_length", "identical_to_plain", "first_divergence",
              "divergence_gap_max", "new_tokens", "wall_s",
              "draft_ms", "verify_ms", "other_ms", "prefill_s", "cycles", "max_new_tokens", "n_prompts",
              "repeats", "per_position_acceptance", "otps_all"]


def machine_info() -> dict:
    import torch
    import transformers

    from peagle.machine import isa_label

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "amx_bf16": "amx_bf16" in flags.split(), "isa": isa_label(flags.split()), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _fmt(x, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _groups(rows: list[dict]):
    keys = []
    for r in rows:
        k = (r["dataset"], r["temperature"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        yield k, [r for r in rows if (r["dataset"], r["temperature"]) == k]


def _best(rows: list[dict], arm: str, batch: int, fixed_only: bool = True) -> dict | None:
    cands = [r for r in rows if r["arm"] == arm and r["batch_size"] == batch
             and (not fixed_only or r["draft_k"] != "auto")]
    return max(cands, key=lambda r: r["otps"]) if cands else None


def _get(rows, arm, k, batch):
    return next((r for r in rows if r["arm"] == arm and r["draft_k"] == k and r["batch_size"] == batch), None)


def seed_table(rows: list[dict]) -> str:
    """The seed article's table: OTPS per concurrency for P-EAGLE / EAGLE-3 at each K, baseline, ratios."""
    ks = sorted({r["draft_k"] for r in rows if r["arm"] in ("peagle", "eagle3") and r["draft_k"] != "auto"})
    batches = sorted({r["batch_size"] for r in rows})
    header = (["Concurrency"] + [f"P-EAGLE K={k}" for k in ks] + [f"EAGLE-3 K={k}" for k in ks]
              + ["Baseline", "P-EAGLE / EAGLE-3", "P-EAGLE / Baseline"])
    body = []
    for b in batches:
        cells = [b]
        cells += [_get(rows, "peagle", k, b)["otps"] if _get(rows, "peagle", k, b) else None for k in ks]
        cells += [_get(rows, "eagle3", k, b)["otps"] if _get(rows, "eagle3", k, b) else None for k in ks]
        base, pe, e3 = _get(rows, "plain", 0, b), _best(rows, "peagle", b), _best(rows, "eagle3", b)
        cells.append(base["otps"] if base else None)
        cells.append(f"{pe['otps'] / e3['otps']:.2f}x" if pe and e3 else "-")
        cells.append(f"{pe['otps'] / base['otps']:.2f}x" if pe and base else "-")
        body.append(cells)
    return _table(header, body)


def peers_table(rows: list[dict]) -> str:
    """Every other arm's OTPS per concurrency: n-gram, auto draft_k, HF generate / prompt lookup."""
    cols = []  # labels: one column per arm, draft_k and tree size
    for r in rows:
        if (r["arm"] not in ("peagle", "eagle3", "plain") or r["draft_k"] == "auto") and r["label"] not in cols:
            cols.append(r["label"])
    batches = sorted({r["batch_size"] for r in rows})
    by = {(r["label"], r["batch_size"]): r for r in rows}
    body = [[b] + [by.get((c, b), {}).get("otps") for c in cols] for b in batches]
    return _table(["Concurrency"] + cols, body)


def _identical(r: dict) -> str:
    ident = r.get("identical_to_plain")
    if ident is None:
        return "-"
    if ident == 1.0:
        return "100%"
    return f"{ident:.0%} (ties: top-2 gap <= {r['divergence_gap_max']:.2f})"


def detail_table(rows: list[dict]) -> str:
    header = ["Arm", "Concurrency", "OTPS", "Speed-up", "Acceptance length", "Draft ms/cycle",
              "Verify ms/cycle", "Other ms/cycle", "Identical to plain", "Mean K"]
    body = []
    for r in rows:
        body.append([r["label"], r["batch_size"], r["otps"],
                     f"{r['speedup_vs_baseline']:.2f}x" if r.get("speedup_vs_baseline") else "-",
                     _fmt(r.get("acceptance_length"), 2), _fmt(r.get("draft_ms"), 1), _fmt(r.get("verify_ms"), 1),
                     _fmt(r.get("other_ms"), 1), _identical(r),
                     _fmt(r.get("mean_draft_k"), 1) if r.get("mean_nodes") is None else f"{r['mean_nodes']:.1f} nodes"])
    return _table(header, body)


def _paired_ratio(row: dict, ref: dict) -> float:
    """Median over repeats of row's OTPS / ref's OTPS in the same repeat, else the ratio of medians.

    The arms of one repeat run back to back, so pairing them cancels the machine's slow drifts,
    which on a shared CPU are larger than the differences this ratio is asked to resolve.
    """
    a, b = row.get("otps_all") or [], ref.get("otps_all") or []
    if a and len(a) == len(b) and all(b):
        return median(x / y for x, y in zip(a, b))
    return row["otps"] / ref["otps"] if ref["otps"] else 0.0


def auto_table(rows: list[dict]) -> str:
    """draft_k="auto" against the best fixed draft_k (highest median OTPS) of the same arm, per
    concurrency; the ratio pairs the two arms repeat by repeat (``_paired_ratio``)."""
    body = []
    for r in rows:
        if r["draft_k"] != "auto":
            continue
        best = _best(rows, r["arm"], r["batch_size"])
        if best is None:
            continue
        ratio = _paired_ratio(r, best)
        rule = " (pooled)" if r.get("auto_rule") == "pooled" else ""
        body.append([ARMS[r["arm"]].label + rule, r["batch_size"], r["otps"], f"K={best['draft_k']}", best["otps"],
                     f"{ratio:.3f}x", "yes" if round(ratio, 3) >= 0.95 else "no", _fmt(r.get("mean_draft_k"), 1)])
    for r in rows:  # tree_nodes="auto" against the best fixed budget at the same depth
        if r.get("tree_nodes") != "auto":
            continue
        fixed = [x for x in rows if x["arm"] == r["arm"] and x["batch_size"] == r["batch_size"]
                 and x["draft_k"] == r["draft_k"] and x.get("tree_nodes") != "auto"]
        if not fixed:
            continue
        best = max(fixed, key=lambda x: x["otps"])
        ratio = _paired_ratio(r, best)
        body.append([f"{ARMS[r['arm']].label} K={r['draft_k']} auto nodes", r["batch_size"], r["otps"],
                     f"{best['tree_nodes']} nodes", best["otps"], f"{ratio:.3f}x",
                     "yes" if round(ratio, 3) >= 0.95 else "no", f"{r.get('mean_nodes', 0):.1f} nodes"])
    if not body:
        return ""
    return _table(["Arm", "Concurrency", "auto OTPS", "Best fixed", "Best fixed OTPS", "auto / best (paired)",
                   "Within 5%", "Mean K chosen"], body)


def _setting(r: dict) -> str:
    """An arm's label without its head's name, with its fixed draft_k and tree size: "tree + n-gram K=7 10 nodes"."""
    arm = ARMS[r["arm"]]
    label = arm.label.split(" ", 1)[1] if " " in arm.label else "chain"
    nodes = f" {r['tree_nodes']} nodes" if arm.tree else ""
    return f"{label} K={r['draft_k']}{nodes}"


def head_to_head_table(rows: list[dict]) -> str:
    """P-EAGLE's fastest arm against EAGLE-3's (chains and trees, fixed settings) per concurrency:
    OTPS, acceptance length and draft + verify ms a cycle of each, and the ratio paired by repeat
    (``_paired_ratio``). Empty unless both heads ran."""
    body = []
    for b in sorted({r["batch_size"] for r in rows}):
        best = {}
        for head in ("peagle", "eagle3"):
            cands = [r for r in rows if ARMS[r["arm"]].head == head and r["batch_size"] == b
                     and r["draft_k"] != "auto" and r.get("tree_nodes") != "auto"]
            best[head] = max(cands, key=lambda r: r["otps"]) if cands else None
        if best["peagle"] is None or best["eagle3"] is None:
            continue
        cells = [b]
        for r in (best["peagle"], best["eagle3"]):
            vs_plain = r.get("speedup_vs_baseline")
            cells.append(f"{_setting(r)}: {r['otps']:,.1f} ({f'{vs_plain:.2f}x' if vs_plain else '-'}; "
                         f"{_fmt(r.get('acceptance_length'), 2)}; {_fmt(r.get('draft_ms'), 1)} + "
                         f"{_fmt(r.get('verify_ms'), 1)} ms)")
        cells.append(f"{_paired_ratio(best['peagle'], best['eagle3']):.3f}x")
        body.append(cells)
    if not body:
        return ""
    # each arm's speed-up over plain sits beside the ratio: where both are below 1x, neither head pays here
    return _table(["Concurrency", "P-EAGLE's best arm: OTPS (vs plain; acceptance; draft + verify)", "EAGLE-3's best arm",
                   "P-EAGLE / EAGLE-3 (paired)"], body)


def header(meta: dict) -> list[str]:
    """The lines every report opens with: model, dtype and threads (with why), machine, heads, command."""
    m = meta["machine"]
    return [f"peagle bench: {meta['model']} ({meta['dtype']}), {m['cores']} cores ({m.get('isa', '?')}), torch threads "
            f"{m['torch_threads']}, AMX bf16 {'yes' if m['amx_bf16'] else 'no'}, {m['date']}",
            f"dtype {meta.get('dtype_reason') or meta['dtype']}",
            f"threads {meta.get('threads_reason') or m['torch_threads']}",
            f"heads: {'; '.join(f'{k}: {v}' for k, v in meta['heads'].items()) or '-'}",
            f"command: {meta['command']}"]


def _summary_label(r: dict) -> str:
    label = ARMS[r["arm"]].label + (" auto" if r["draft_k"] == "auto" else "")
    label += " (pooled)" if r.get("auto_rule") == "pooled" else ""
    return label + (" auto nodes" if r.get("tree_nodes") == "auto" else "")


def summary_table(rows: list[dict]) -> str:
    """One line per arm (the best fixed draft_k / tree size, and auto apart): OTPS, speed-up over
    plain and the setting per concurrency, then the share of greedy outputs identical to plain."""
    batches = sorted({r["batch_size"] for r in rows})
    labels = list(dict.fromkeys(_summary_label(r) for r in rows))
    body = []
    for label in labels:
        cells = []
        group = [r for r in rows if _summary_label(r) == label]
        for b in batches:
            cands = [r for r in group if r["batch_size"] == b]
            if not cands:
                cells.append("-")
                continue
            best = max(cands, key=lambda r: r["otps"])
            setting = ""
            if ARMS[best["arm"]].drafts and best["draft_k"] != "auto":
                setting = f", K={best['draft_k']}"
            if ARMS[best["arm"]].tree and best.get("tree_nodes") != "auto":
                setting += f" {best['tree_nodes']} nodes"
            speed = f"{best['speedup_vs_baseline']:.2f}x" if best.get("speedup_vs_baseline") else "-"
            cells.append(f"{best['otps']:,.1f} ({speed}{setting})")
        ident = [r["identical_to_plain"] for r in group if r.get("identical_to_plain") is not None]
        body.append([label] + cells + [f"{min(ident):.0%}" if ident else "-"])
    return _table(["Arm"] + [f"concurrency {b}: OTPS (vs plain)" for b in batches] + ["Identical to plain"], body)


def summary(rows: list[dict], meta: dict, report_path) -> str:
    """What `peagle bench` prints: the header and one short table per (dataset, temperature)."""
    out = header(meta) + [""]
    for (dataset, temperature), group in _groups(rows):
        out += [f"{dataset}, temperature {temperature:g}: best setting per arm", summary_table(group), ""]
        versus = head_to_head_table(group)
        if versus:
            out += [f"{dataset}, temperature {temperature:g}: P-EAGLE's best arm against EAGLE-3's", versus, ""]
    out.append(f"full report (every row, time split per cycle, notes): {report_path}")
    return "\n".join(out)


def human_report(rows: list[dict], notes: list[str], meta: dict) -> str:
    out = header(meta) + [""]
    for (dataset, temperature), group in _groups(rows):
        title = f"{dataset}, temperature {temperature:g}"
        out += [f"{title}: output tokens/s (OTPS)", seed_table(group), ""]
        out += [f"{title}: other arms, OTPS", peers_table(group), ""]
        versus = head_to_head_table(group)
        if versus:
            out += [f"{title}: P-EAGLE's best arm against EAGLE-3's", versus, ""]
        auto = auto_table(group)
        if auto:
            out += [f"{title}: draft_k=auto (and tree_nodes=auto) vs the best fixed setting", auto, ""]
        out += [f"{title}: every row (time split per cycle from GenerationStats)", detail_table(group), ""]
    out += [f"note: {n}" for n in notes]
    if any(r.get("identical_to_plain") is not None and r["identical_to_plain"] < 1.0 for r in rows):
        out.append("note: where an arm is not identical to plain decoding, the texts part at a near-tie of the target's "
                   "top-2 logits (gap shown): in bf16 the target's logits depend on how many tokens a forward scores, "
                   "so ties flip; the same arms are token-identical in float32 (see docs/benchmarks.md).")
    return "\n".join(out)


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (" ".join(f"{x:.4g}" for x in v) if isinstance(v, list) else v) for k, v in r.items()})


def write_plots(rows: list[dict], out_dir: Path) -> list[Path]:
    """OTPS vs concurrency per arm; acceptance by draft position; speed-up vs draft_k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    groups = list(_groups(rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    for ax, ((dataset, temp), g) in zip(axes[0], groups):
        batches = sorted({r["batch_size"] for r in g})
        for arm in dict.fromkeys(r["arm"] for r in g):
            pts = [(b, _best(g, arm, b)) for b in batches]
            pts = [(b, r["otps"]) for b, r in pts if r]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=ARMS[arm].colour,
                        label=ARMS[arm].label + (" (best K)" if ARMS[arm].drafts else ""))
        ax.set(title=f"{dataset}, T={temp:g}", xlabel="concurrency (batch size)", ylabel="output tokens/s", xticks=batches)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "otps_vs_concurrency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(6, 4))
    for gi, ((dataset, temp), g) in enumerate(groups):
        b0 = min(r["batch_size"] for r in g)
        for arm in ("peagle", "eagle3", "ngram"):
            cands = [r for r in g if r["arm"] == arm and r["batch_size"] == b0 and r["draft_k"] != "auto" and r.get("per_position_acceptance")]
            if cands:
                r = max(cands, key=lambda r: r["draft_k"])
                acc = r["per_position_acceptance"]
                ax.plot(range(1, len(acc) + 1), acc, marker="o", color=ARMS[arm].colour, ls=styles[gi % 4], label=f"{r['label']}, {dataset} T={temp:g}")
    ax.set(xlabel="draft position", ylabel="P(draft accepted)", ylim=(0, 1.02), title="Acceptance by draft position (concurrency 1)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "acceptance_by_position.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    batches = sorted({r["batch_size"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.5 * len(batches), 3.8), squeeze=False, sharey=True)
    for ax, b in zip(axes[0], batches):
        for gi, ((dataset, temp), g) in enumerate(groups):
            lines = sorted({(r["arm"], r.get("tree_nodes") or 0) for r in g if ARMS[r["arm"]].drafts},
                           key=lambda key: (list(ARMS).index(key[0]), str(key[1]).zfill(4)))  # one line per arm and tree size
            for arm, nodes in lines:
                pts = sorted((r["draft_k"], r["speedup_vs_baseline"]) for r in g if r["arm"] == arm and r["batch_size"] == b
                             and (r.get("tree_nodes") or 0) == nodes and r["draft_k"] != "auto" and r.get("speedup_vs_baseline"))
                if pts:
                    size = f" {nodes} nodes" if nodes else ""
                    ax.plot(*zip(*pts), marker="o", color=ARMS[arm].colour, ls=styles[gi % len(styles)],
                            label=f"{ARMS[arm].label}{size}, {dataset} T={temp:g}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xlabel="draft_k", title=f"concurrency {b}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speed-up over plain decoding")
    if axes[0][0].get_legend_handles_labels()[0]:  # a sweep of draft_k=auto alone has no fixed-k line
        axes[0][0].legend(fontsize=6)
    fig.suptitle("Speed-up vs draft_k")
    fig.tight_layout()
    paths.append(out_dir / "speedup_vs_draft_k.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def json_line(rows: list[dict], notes: list[str], meta: dict) -> str:
    """One JSON document on one line: every row, the notes and the run's metadata."""
    def clean(v):
        return round(v, 5) if isinstance(v, float) else [clean(x) for x in v] if isinstance(v, list) else v
    return json.dumps({"meta": meta, "notes": notes, "rows": [{k: clean(v) for k, v in r.items()} for r in rows]},
                      separators=(",", ":"))
