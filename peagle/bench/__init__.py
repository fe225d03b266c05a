"""`peagle bench`: plain decoding, EAGLE-3, P-EAGLE, n-gram and HF generate on the same prompts.

    peagle bench                                  # embedded SmolLM2, dtype auto, HumanEval + MT-Bench
    peagle bench --draft-k 3,7,11,auto --batch-sizes 1,4,8 --temperatures 0,0.7
    peagle bench --prompts my.jsonl --datasets ""  # any JSONL with a "prompt" field
    peagle bench --quick                          # seconds, on a tiny random model (smoke test)
    peagle bench --arms plain,llamacpp,llamacpp_prompt_lookup --batch-sizes 1   # llama.cpp reference

Prints a short summary (the best setting of each arm per concurrency) and writes the full report
(report.md), rows.csv, rows.json and three PNG plots under --out; ``--json`` also prints the rows
as one JSON document, the last stdout line. Arguments are checked before anything loads. Each finished group
(dataset, temperature, batch size) is appended to --out's partial.jsonl as it ends, so an
interrupted run started again with the same command and --out redoes only the groups it lacks.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from .arms import ARMS, AUTO_RULES, DEFAULT_ARMS, DRAFTERS, ArmRunner, build_drafter
from .journal import Journal
from .models import COMPILE_HELP
from .sweep import SweepConfig, chunks, count_runs, run_group

#: (full default, --quick default) for every option --quick changes
_DEFAULTS = {
    "model": ("embedded", "tiny"), "dtype": ("auto", "float32"), "datasets": ("humaneval,mtbench", "humaneval"),
    "draft_k": ("3,7,11,auto", "3,auto"), "batch_sizes": ("1,4,8", "1,2"), "temperatures": ("0", "0,0.7"),
    "num_prompts": (8, 2), "max_new_tokens": (128, 16), "repeats": (1, 1), "warmup": (1, 1),
    "threads": (0, 1),  # 0 = peagle.machine.default_threads; a tiny model runs fastest (and steadiest) on one thread
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny random model, tiny sweep: a smoke test in seconds")
    p.add_argument("--model", help="embedded (SmolLM2-135M-Instruct), tiny (random, for tests) or an HF model dir")
    p.add_argument("--dtype", help="auto | bfloat16 | float32 | float16 (default auto: the faster here, "
                                   "peagle.machine; --quick float32)")
    p.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    p.add_argument("--int8-heads", dest="int8_heads", action="store_true",
                   help="every EAGLE-3 / P-EAGLE arm (chains, trees, n-gram branches) drafts with an int8 copy of its "
                        "head (peagle.quantize_int8; CPU only, the float head where int8 cannot run)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma list from {','.join(ARMS)} (default: all but dflash and the llama.cpp arms)")
    p.add_argument("--gguf", help="GGUF file for the llama.cpp arms (default: the embedded model's)")
    p.add_argument("--draft-k", dest="draft_k", help="comma list of draft_k values and/or auto (default 3,7,11,auto)")
    p.add_argument("--tree-nodes", dest="tree_nodes", default="32",
                   help="comma list of node budgets for the tree arms (dynamic trees, draft_k deep; default 32)")
    p.add_argument("--batch-sizes", dest="batch_sizes", help="concurrency levels (default 1,4,8)")
    p.add_argument("--datasets", help="comma list: humaneval, mtbench (default both)")
    p.add_argument("--prompts", action="append", default=[], metavar="FILE", help="JSONL file with a `prompt` (or `text`) field (repeatable)")
    p.add_argument("--num-prompts", dest="num_prompts", type=int, help="prompts per dataset (default 8)")
    p.add_argument("--temperatures", help="comma list; 0 = greedy (default 0; e.g. 0,0.7)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (batch i of a repeat uses seed + i)")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, help="tokens per prompt (default 128)")
    p.add_argument("--repeats", type=int, help="timed repeats; rows report medians (default 1)")
    p.add_argument("--warmup", type=int, help="untimed warm-up calls per arm and group (default 1)")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="feed prompts raw, without the chat template")
    p.add_argument("--peagle-head", help="trained P-EAGLE head for peagle.load_drafter (default: the shipped one)")
    p.add_argument("--eagle3-head", help="trained EAGLE-3 head for peagle.load_drafter (default: the shipped one)")
    p.add_argument("--dflash-head", help="trained DFlash head directory for the dflash arm (default: a shipped one, if any)")
    p.add_argument("--threads", type=int, help="torch threads (default 0: peagle.machine.default_threads, 1 on a "
                                                "2-core machine; --quick 1)")
    p.add_argument("--auto-rules", dest="auto_rules", default=AUTO_RULES[0],
                   help="comma list of draft_k=auto objectives, each run as its own arm, side by side: slowest_row "
                        "(the default) and/or pooled (the mean row: DraftKPolicy(slowest_row=False))")
    p.add_argument("--out", help="output directory (default runs/bench-<date>)")
    p.add_argument("--json", action="store_true", help="also print every row as one JSON document (the last line)")


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    for name, (full, quick) in _DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def _split(text: str, cast=str) -> tuple:
    return tuple(cast(x.strip()) for x in str(text).split(",") if x.strip())


def _ints(option: str, text, low: int, auto: bool = False) -> tuple:
    """A comma list of integers >= low (and "auto" where allowed), or a ValueError naming the option."""
    allowed = f"integers >= {low}" + (" and/or auto" if auto else "")
    out = []
    for x in _split(text):
        if auto and x == "auto":
            out.append(x)
        elif x.lstrip("-").isdigit() and int(x) >= low:
            out.append(int(x))
        else:
            raise ValueError(f"--{option} must be a comma list of {allowed}, got {text!r}")
    if not out:
        raise ValueError(f"--{option} must be a comma list of {allowed}, got nothing")
    return tuple(out)


def validate(args: argparse.Namespace) -> dict:
    """Every argument range, checked before any model, peer or drafter sees a value; returns the
    parsed lists {"arms", "draft_ks", "batch_sizes", "temperatures", "tree_nodes", "auto_rules"}."""
    from peagle.machine import parse_dtype

    arms = _split(args.arms)
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown:
        raise ValueError(f"--arms must be a comma list from {', '.join(ARMS)}, got {args.arms!r}")
    auto_rules = _split(args.auto_rules)
    if not auto_rules or any(r not in AUTO_RULES for r in auto_rules):
        raise ValueError(f"--auto-rules must be a comma list from {', '.join(AUTO_RULES)}, got {args.auto_rules!r}")
    try:
        temperatures = tuple(float(x) for x in _split(args.temperatures))
    except ValueError:
        temperatures = ()
    if not temperatures or any(not t >= 0 for t in temperatures):
        raise ValueError(f"--temperatures must be a comma list of numbers >= 0 (0 = greedy), got {args.temperatures!r}")
    for option, value, low in (("num-prompts", args.num_prompts, 1), ("max-new-tokens", args.max_new_tokens, 1),
                               ("repeats", args.repeats, 1), ("warmup", args.warmup, 0), ("threads", args.threads, 0)):
        if value < low:
            raise ValueError(f"--{option} must be an integer >= {low}, got {value}")
    parse_dtype(args.dtype)
    if not _split(args.datasets) and not args.prompts:
        raise ValueError("nothing to run: give --datasets and/or --prompts FILE")
    return {"arms": arms, "draft_ks": _ints("draft-k", args.draft_k, 1, auto=True),
            "batch_sizes": _ints("batch-sizes", args.batch_sizes, 1), "temperatures": temperatures,
            "tree_nodes": _ints("tree-nodes", args.tree_nodes, 1, auto=True), "auto_rules": auto_rules}


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    args = _resolve(args)
    checked = validate(args)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # the weight-loading bar: our own bar is enough
    threads = torch.get_num_threads()
    try:
        return _run(args, checked)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, checked: dict) -> int:
    from peagle.evalsets import dataset_label, load_prompts
    from peagle.machine import apply_threads, parse_dtype
    from peagle.prompts import encode_prompts

    from .models import load_bench_target, warm_for
    from .report import human_report, json_line, machine_info, summary, write_csv, write_plots

    arms = checked["arms"]
    cfg = SweepConfig(arms=arms, draft_ks=checked["draft_ks"], batch_sizes=checked["batch_sizes"],
                      temperatures=checked["temperatures"], max_new_tokens=args.max_new_tokens,
                      repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                      tree_nodes=checked["tree_nodes"], auto_rules=checked["auto_rules"])
    datasets = list(_split(args.datasets)) + list(args.prompts)
    out_dir = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)

    apply_threads(args.threads or "auto")
    dtype = parse_dtype(args.dtype)
    if dtype == "auto" and args.model == "tiny":
        import torch

        dtype = torch.float32  # a random 2-layer model: nothing to measure
    print(f"loading the {args.model} target (dtype {args.dtype}) ...", file=sys.stderr)
    target = load_bench_target(args.model, dtype, compile=args.compile)
    threads, threads_why = apply_threads(args.threads or "auto")  # load_target applied its own default
    drafters, heads = _load_drafters(args, target, arms)
    llamacpp = _llamacpp_runner(args, target, threads) if any(ARMS[a].runs == "llamacpp" for a in arms) else None
    if isinstance(llamacpp, str):
        print(f"llama.cpp arms skipped: {llamacpp}", file=sys.stderr)
    elif llamacpp is not None:
        heads["llamacpp"] = f"llama-cpp-python on {Path(llamacpp.gguf).name}, {threads} thread(s)"
    runner = ArmRunner(target, drafters, llamacpp=llamacpp)
    prompts = {dataset_label(d): encode_prompts(target, load_prompts(d, args.num_prompts), chat=args.chat) for d in datasets}
    # --compile: compile the target's and the heads' widths now
    warm_for(target, [p for ids in prompts.values() for p in ids], cfg.max_new_tokens, drafters.values())

    meta = {"command": _command_line(args), "model": args.model, "dtype": str(target.dtype).replace("torch.", ""),
            "dtype_reason": getattr(target, "dtype_reason", None) or f"{str(target.dtype).replace('torch.', '')}: requested",
            "threads_reason": f"{threads}: {threads_why}",
            "chat": args.chat, "heads": heads, "machine": machine_info(), "config": {
                "arms": list(arms), "draft_k": list(cfg.draft_ks), "batch_sizes": list(cfg.batch_sizes),
                "temperatures": list(cfg.temperatures), "datasets": list(prompts), "num_prompts": args.num_prompts,
                "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats, "warmup": cfg.warmup, "seed": cfg.seed,
                "tree_nodes": list(cfg.tree_nodes), "auto_rules": list(cfg.auto_rules), "compile": args.compile}}
    if args.compile:
        meta["dtype_reason"] += f"; target and heads compiled at widths {target.static.widths} (--compile)"
    for kind, source in heads.items():
        if not source.startswith("trained") and (kind not in DRAFTERS or DRAFTERS[kind].weights):
            print(f"warning: {kind}: {source}", file=sys.stderr)

    journal = Journal(out_dir / "partial.jsonl", {k: v for k, v in meta.items()
                                                  if k not in ("command", "machine", "dtype_reason", "threads_reason")})
    rows, notes = _measure(runner, cfg, prompts, journal)
    notes += [f"{kind}: {source}" for kind, source in heads.items() if "random-init" in source]

    (out_dir / "report.md").write_text(human_report(rows, notes, meta) + "\n")
    write_csv(rows, out_dir / "rows.csv")
    plots = write_plots(rows, out_dir)
    line = json_line(rows, notes, meta)
    (out_dir / "rows.json").write_text(line + "\n")
    print(summary(rows, meta, out_dir / "report.md"))
    print(f"wrote {out_dir / 'rows.csv'}, {out_dir / 'rows.json'}, " + ", ".join(str(p) for p in plots))
    if args.json:
        print(line)
    return 0


def _load_drafters(args: argparse.Namespace, target, arms: tuple[str, ...]) -> tuple[dict, dict[str, str]]:
    """The drafters the chosen arms draft with, each loaded once: ({name: drafter}, {name: where its head is from})."""
    drafters, heads = {}, {}
    for name, source in DRAFTERS.items():
        if any(ARMS[a].drafter == name for a in arms):
            path = getattr(args, f"{source.head_option or name}_head", None)  # --peagle-head, --eagle3-head, --dflash-head
            drafter, why = build_drafter(name, target, path, args.model == "embedded" or path is not None,
                                         getattr(args, "int8_heads", False))
            if drafter is None:
                print(f"{ARMS[name].label} skipped: {why}", file=sys.stderr)
            else:
                drafters[name], heads[name] = drafter, why
    return drafters, heads


def _measure(runner: ArmRunner, cfg: SweepConfig, prompts: dict[str, list], journal: Journal) -> tuple[list, list[str]]:
    """(rows, notes) of every (dataset, temperature, batch size) group, the journal's measured ones reused."""
    from tqdm.auto import tqdm

    rows, notes = [], []
    if journal.done:
        print(f"resuming {journal.path}: {len(journal.done)} group(s) already measured", file=sys.stderr)
        notes.append(f"resumed: {len(journal.done)} group(s) come from an earlier process ({journal.path.name})")
    with tqdm(total=count_runs(cfg, [len(p) for p in prompts.values()]), desc="bench", unit="call", file=sys.stderr) as bar:
        for name, ids in prompts.items():
            for temperature in cfg.temperatures:
                for batch_size in cfg.batch_sizes:
                    key = (name, temperature, batch_size)
                    if key in journal.done:
                        r, n = journal.done[key]
                        bar.update(len(cfg.specs()) * cfg.repeats * len(chunks(ids, batch_size)))
                    else:
                        bar.set_postfix_str(f"{name} T={temperature:g} B={batch_size}")
                        r, n = run_group(runner, cfg, ids, dataset=name, temperature=temperature,
                                         batch_size=batch_size, progress=bar)
                        journal.add(key, r, n)
                    rows += r
                    notes += n
    return rows, notes


def _llamacpp_runner(args: argparse.Namespace, target, threads: int):
    """A LlamaCppRunner on --gguf (default: the embedded model's GGUF), or why not (a string)."""
    from .llamacpp import LlamaCppRunner, embedded_gguf, unavailable

    gguf = args.gguf or (embedded_gguf() if args.model == "embedded" else None)
    why = unavailable(gguf)
    return why if why else LlamaCppRunner(gguf, threads, set(target.eos_token_ids))


def _command_line(args: argparse.Namespace) -> str:
    """The command as typed, for the report (``main(argv)`` records argv; the CLI has sys.argv)."""
    argv = getattr(args, "argv", None)
    if argv is None:
        argv = sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]
    return "peagle bench " + " ".join(shlex.quote(a) for a in argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="peagle bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return run(args)

