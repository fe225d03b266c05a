"""What this machine's CPU does fast, and the two defaults peagle derives from it: dtype and threads.

``dtype="auto"`` (``peagle.load_target``, ``Target.from_pretrained``): on CUDA, bfloat16. On a CPU
the target's own forward cost is measured once per machine over 1, 2, 4 and 8 new tokens at a
100-token context, in float32 and in a bfloat16 copy (medians of 5 shuffled rounds; 11.7 s of CPU time for
SmolLM2-135M), and the result is cached as JSON under ``peagle.machine.cache_dir()`` keyed by
the CPU model, its matmul-relevant flags, torch version, thread count and the model's shape.
:func:`choose_dtype` then applies one rule:

    bfloat16 iff (a bf16 step is not slower than an fp32 one (5% slack) and verifying 4 and 8
    tokens costs no more steps in bf16 than in fp32) or bf16 is >= 20% faster at every size.

Speculative decoding pays when verifying k + 1 tokens costs little more than one step, so the
relative verify cost matters as much as the step. On the 2-core AMD EPYC (AVX2 only, no
avx512_bf16 / AMX; 1 thread; the measurement the first ``peagle.load_target()`` makes, its
``dtype_reason``, while other processes held a load average of about 9) verifying 4 tokens cost
1.8x a step in fp32 and 2.7x in bf16, 8 tokens 2.1x and 4.4x; the one-token step was not slower in
bf16 (217 vs 258 ms, both inflated by the load), so the rule picks float32 there. CPUs with AMX or
avx512_bf16 score many bf16 rows for little more than one.

Threads (:func:`default_threads`): OpenMP threads that share a core with another busy process
wait for it at every barrier. On the shared 2-core AMD EPYC, with other processes holding a load
average of 7-9, plain decoding of the embedded target ran at 3.8-6.4 tok/s with 1 thread and 0.8
with 2; with one more busy process, 2.6-3.3 and 0.5-0.6 (medians of 3 repeats, two runs each,
``peagle bench --arms plain --datasets humaneval --num-prompts 2 --max-new-tokens 32 --batch-sizes 1 --repeats 3 --dtype float32 --threads N``). So a machine of at most 2 cores gets 1 thread; a bigger one gets
half its cores (at most 8, not measured), leaving room for other processes. ``PEAGLE_THREADS`` or
``OMP_NUM_THREADS``, when set, win.
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from .dtypes import DTYPES, cast_parameters
from .forward_cost import measure_interleaved

#: /proc/cpuinfo flags that decide how fast a bf16 or fp32 matmul runs
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
#: new-token counts the dtype measurement times, and the context already in the cache
MEASURE_TOKENS = (1, 2, 4, 8)
MEASURE_CONTEXT = 100
CACHE_FILE = "machine.json"


def cpu_facts() -> dict:
    """{"cpu": model name, "flags": the FLAGS present, "cores": usable cores, "torch": version}."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and cpu in ("", platform.processor(), platform.machine()):
                    cpu = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return {"cpu": cpu, "flags": [f for f in FLAGS if f in flags], "cores": cores, "torch": torch.__version__}


def isa_label(flags) -> str:
    """The best bf16 matmul path the flags allow: "AMX", "avx512_bf16", "AVX-512 (no bf16)", "AVX2 only"."""
    flags = set(flags)
    if {"amx_bf16", "amx_tile"} <= flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "AVX-512 (no bf16)"
    return "AVX2 only" if "avx2" in flags else "no AVX2"


def native_bf16(flags) -> bool:
    return isa_label(flags) in ("AMX", "avx512_bf16")


# -- threads -------------------------------------------------------------------------------
def default_threads(cores: int | None = None, env: dict | None = None) -> tuple[int, str]:
    """(threads, why): 1 on a machine of <= 2 cores, else half the cores (at most 8); an explicit
    PEAGLE_THREADS or OMP_NUM_THREADS wins."""
    env = os.environ if env is None else env
    for name in ("PEAGLE_THREADS", "OMP_NUM_THREADS"):
        value = env.get(name, "")
        if value.strip().isdigit() and int(value) >= 1:
            return int(value), f"{name}={int(value)}"
    cores = cpu_facts()["cores"] if cores is None else int(cores)
    if cores <= 2:
        return 1, (f"{cores} core{'s' if cores != 1 else ''}: a second thread waits at every barrier for a core "
                   "another process holds (busy 2-core machine: plain decoding 5-8x slower with 2 threads than with 1)")
    n = max(1, min(cores // 2, 8))
    return n, f"{cores} cores: half of them (at most 8), leaving room for other processes"


def apply_threads(threads: int | str | None = "auto") -> tuple[int, str]:
    """Set torch's thread count: "auto"/0 -> :func:`default_threads`, an int >= 1 as given, None
    leaves torch's setting. Returns (threads now, why)."""
    if threads is None:
        return torch.get_num_threads(), "torch's setting, unchanged"
    if threads == "auto" or threads == 0:
        n, why = default_threads()
    elif isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
        n, why = threads, "requested"
    else:
        raise ValueError(f"threads must be 'auto', 0 (auto), an int >= 1 or None, got {threads!r}")
    torch.set_num_threads(n)
    return n, why


# -- dtype ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str  # one line: the dtype, then why
    costs: dict | None = None  # {"float32": {n: ms}, "bfloat16": {n: ms}} when measured


def parse_dtype(dtype) -> torch.dtype | str:
    """A torch dtype, or "auto"; names such as "bf16" / "float32" are accepted (peagle.dtypes)."""
    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return "auto" if dtype is None else dtype
    name = str(dtype).replace("torch.", "").lower()
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto', a torch dtype or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[name]


def choose_dtype(costs: dict, flags=()) -> tuple[str, str]:
    """(dtype name, reason) from costs {"float32": {n: ms}, "bfloat16": {n: ms}} for n in 1, 4, 8.

    The rule is the module docstring's: bf16 iff its step is not slower (5% slack) and its verify of
    4 and 8 tokens costs no more steps than fp32's, or it is >= 20% faster at every size.
    """
    f, b = ({int(n): float(ms) for n, ms in costs[d].items()} for d in ("float32", "bfloat16"))
    for d, c in (("float32", f), ("bfloat16", b)):
        if not {1, 4, 8} <= set(c) or min(c.values()) <= 0:
            raise ValueError(f"costs[{d!r}] must hold positive ms for 1, 4 and 8 new tokens, got {c}")
    ratio = {d: {n: c[n] / c[1] for n in (4, 8)} for d, c in (("float32", f), ("bfloat16", b))}
    not_slower = b[1] <= 1.05 * f[1]
    verify_cheaper = all(ratio["bfloat16"][n] <= ratio["float32"][n] for n in (4, 8))
    clearly_faster = all(b[n] <= 0.8 * f[n] for n in set(f) & set(b))
    name = "bfloat16" if (not_slower and verify_cheaper) or clearly_faster else "float32"
    isa = isa_label(flags)
    cpu = (f"this CPU has native bf16 matmul ({isa})" if native_bf16(flags)
           else f"this CPU has no native bf16 matmul ({isa})")
    reason = (f"{name}: {cpu}; a step costs {f[1]:.0f} ms in fp32, {b[1]:.0f} ms in bf16; verifying 4 tokens "
              f"costs {ratio['float32'][4]:.1f}x a step in fp32, {ratio['bfloat16'][4]:.1f}x in bf16 "
              f"(8 tokens: {ratio['float32'][8]:.1f}x, {ratio['bfloat16'][8]:.1f}x)")
    return name, reason


def model_signature(config) -> str:
    """The shape that decides a forward's cost: architecture, layers, widths, vocabulary."""
    c = getattr(config, "get_text_config", lambda: config)()
    parts = [getattr(c, "model_type", "?")] + [str(getattr(c, k, "?")) for k in
                                               ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")]
    return "-".join(parts)


def cache_key(facts: dict, threads: int, signature: str) -> str:
    """One measurement per CPU model, flag set, torch version, thread count and model shape."""
    return f"{facts['cpu']}|{','.join(sorted(facts['flags']))}|torch {facts['torch']}|{threads} threads|{signature}"


def cache_dir() -> Path:
    """peagle's cache directory: ``PEAGLE_CACHE``, else ``$XDG_CACHE_HOME/peagle`` (``~/.cache/peagle``)."""
    root = os.environ.get("PEAGLE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "peagle")
    return Path(root)


def _cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def cached_choice(config, threads: int | None = None) -> DtypeChoice | None:
    """The stored choice for this machine and model shape, or None."""
    threads = torch.get_num_threads() if threads is None else threads
    try:
        entry = json.loads(_cache_path().read_text()).get(cache_key(cpu_facts(), threads, model_signature(config)))
    except (OSError, ValueError):
        return None
    if not entry:
        return None
    return DtypeChoice(getattr(torch, entry["dtype"]), entry["reason"] + " (measured once, cached)", entry.get("costs"))


def _store(config, threads: int, choice: DtypeChoice) -> None:
    path = _cache_path()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        data = {}
    data[cache_key(cpu_facts(), threads, model_signature(config))] = {
        "dtype": str(choice.dtype).replace("torch.", ""), "reason": choice.reason, "costs": choice.costs,
        "measured": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def measure_costs(target, rounds: int = 5) -> dict:
    """{"float32": {n: ms}, "bfloat16": {n: ms}}: a float32 target's forward over n new tokens at a
    100-token context and the same for a bfloat16 copy, timed in the same shuffled rounds (the
    target is left untouched)."""
    ids = target.aux_layer_ids
    target.remove_hooks()  # a deep copy would carry hooks that point at this target
    try:
        twin = cast_parameters(copy.deepcopy(target.model), torch.bfloat16)
    finally:
        target.set_aux_layer_ids(ids)
    twin_target = type(target)(twin, target.tokenizer, aux_layer_ids=ids)
    try:
        got = measure_interleaved({"float32": target, "bfloat16": twin_target}, list(MEASURE_TOKENS), 1,
                                  MEASURE_CONTEXT, rounds)
    finally:
        twin_target.remove_hooks()
    return {name: {n: r["ms"] for n, r in by_n.items()} for name, by_n in got.items()}


def auto_dtype_cpu(target, use_cache: bool = True) -> DtypeChoice:
    """The CPU choice for a float32 target: the cached one, else measured (and cached) now."""
    threads = torch.get_num_threads()
    if use_cache:
        hit = cached_choice(target.config, threads)
        if hit is not None:
            return hit
    costs = measure_costs(target)
    name, reason = choose_dtype(costs, cpu_facts()["flags"])
    choice = DtypeChoice(getattr(torch, name), reason + f" ({threads} thread{'s' if threads != 1 else ''})", costs)
    try:
        _store(target.config, threads, choice)
    except OSError:  # a read-only cache costs a re-measurement next time, nothing else
        pass
    return choice
