"""peagle.machine: the dtype rule on synthetic measurements, the cache key, the thread default."""
from __future__ import annotations

import json

import pytest
import torch

from peagle import machine
from peagle.bench.models import tiny_target

# Costs (ms) shaped like the two kinds of CPU measured: AVX2 only (bf16 cost grows with the rows)
# and AMX (a bf16 forward over 8 tokens costs about one step).
AVX2 = {"float32": {1: 60.0, 2: 66.0, 4: 78.0, 8: 96.0}, "bfloat16": {1: 62.0, 2: 80.0, 4: 124.0, 8: 190.0}}
AMX = {"float32": {1: 60.0, 2: 70.0, 4: 90.0, 8: 110.0}, "bfloat16": {1: 55.0, 2: 56.0, 4: 58.0, 8: 62.0}}


def test_avx2_costs_choose_float32_and_say_why():
    name, reason = machine.choose_dtype(AVX2, ["avx2"])
    assert name == "float32"
    assert reason.startswith("float32: this CPU has no native bf16 matmul (AVX2 only)")
    assert "verifying 4 tokens costs 1.3x a step in fp32, 2.0x in bf16" in reason


def test_amx_costs_choose_bfloat16():
    name, reason = machine.choose_dtype(AMX, ["avx2", "avx512f", "amx_bf16", "amx_tile"])
    assert name == "bfloat16" and "native bf16 matmul (AMX)" in reason


def test_bf16_slower_step_loses_unless_clearly_faster_everywhere():
    slow_step = {"float32": AMX["float32"], "bfloat16": {**AMX["bfloat16"], 1: 70.0}}
    assert machine.choose_dtype(slow_step)[0] == "float32"  # cheaper verify, but a slower step
    fast = {"float32": AVX2["float32"], "bfloat16": {n: 0.5 * ms for n, ms in AVX2["float32"].items()}}
    assert machine.choose_dtype(fast)[0] == "bfloat16"  # half the cost at every size
    # JSON round trip (keys become strings) gives the same answer
    assert machine.choose_dtype(json.loads(json.dumps(AVX2)))[0] == "float32"
    with pytest.raises(ValueError, match="costs"):
        machine.choose_dtype({"float32": {1: 1.0}, "bfloat16": {1: 1.0}})


def test_isa_labels():
    assert machine.isa_label(["avx2"]) == "AVX2 only"
    assert machine.isa_label(["avx2", "avx512f"]) == "AVX-512 (no bf16)"
    assert machine.isa_label(["avx2", "avx512f", "avx512_bf16"]) == "avx512_bf16"
    assert machine.isa_label(["amx_bf16", "amx_tile", "avx512_bf16"]) == "AMX"


def test_cache_key_changes_with_cpu_flags_torch_threads_and_model():
    facts = {"cpu": "AMD EPYC 7B13", "flags": ["avx2"], "cores": 2, "torch": "2.13.0"}
    key = machine.cache_key(facts, 1, "llama-30-576-1536-49152")
    assert key == machine.cache_key(dict(facts, cores=4), 1, "llama-30-576-1536-49152")  # cores are not in it
    others = [machine.cache_key(dict(facts, cpu="Intel Xeon"), 1, "s"), machine.cache_key(dict(facts, flags=["avx2", "amx_bf16"]), 1, "s"),
              machine.cache_key(dict(facts, torch="2.12.0"), 1, "s"), machine.cache_key(facts, 2, "s"), machine.cache_key(facts, 1, "s")]
    assert len({key, *others}) == 6


def test_auto_dtype_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path))
    calls = []

    def fake_measure(target, rounds=5):
        calls.append(target)
        return AVX2

    monkeypatch.setattr(machine, "measure_costs", fake_measure)
    target = tiny_target()
    first = machine.auto_dtype_cpu(target)
    second = machine.auto_dtype_cpu(target)
    assert first.dtype == second.dtype == torch.float32 and len(calls) == 1
    assert second.reason.endswith("(measured once, cached)")
    stored = json.loads((tmp_path / machine.CACHE_FILE).read_text())
    assert list(stored) == [machine.cache_key(machine.cpu_facts(), torch.get_num_threads(), machine.model_signature(target.config))]


def test_measure_costs_times_fp32_and_a_bf16_copy_without_touching_the_target():
    target = tiny_target()
    costs = machine.measure_costs(target, rounds=1)
    assert set(costs) == {"float32", "bfloat16"} and all(set(c) == set(machine.MEASURE_TOKENS) for c in costs.values())
    assert target.dtype == torch.float32 and len(target._hooks) == len(target.aux_layer_ids)


def test_threads_default():
    assert machine.default_threads(2, env={})[0] == 1 and machine.default_threads(1, env={})[0] == 1
    assert machine.default_threads(16, env={})[0] == 8 and machine.default_threads(4, env={})[0] == 2
    assert machine.default_threads(2, env={"OMP_NUM_THREADS": "2"}) == (2, "OMP_NUM_THREADS=2")
    assert machine.default_threads(2, env={"PEAGLE_THREADS": "3", "OMP_NUM_THREADS": "2"})[0] == 3
    with pytest.raises(ValueError, match="threads"):
        machine.apply_threads(-1)


def test_commands_keep_their_threads_when_loading_the_default_target():
    """`peagle train ... --threads 2` applies its count before loading the target by name; loading
    must not put the machine's default back (it did: two requested threads ran as one)."""
    from peagle.embedded import load_target_by_name

    before = torch.get_num_threads()
    wanted = 3 if before != 3 else 2
    try:
        torch.set_num_threads(wanted)
        load_target_by_name("default", "float32")
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)


def test_parse_dtype():
    assert machine.parse_dtype("bf16") is torch.bfloat16 and machine.parse_dtype(torch.float32) is torch.float32
    assert machine.parse_dtype("auto") == "auto" and machine.parse_dtype(None) == "auto"
    with pytest.raises(ValueError, match="dtype"):
        machine.parse_dtype("int8")


def test_a_target_measured_on_first_load_is_the_one_later_loads_build(tmp_path, monkeypatch):
    """The first "auto" load measures a float32 model and then casts it; the cast must give the
    model that from_pretrained(dtype=bfloat16) builds, RoPE frequencies (an fp32 buffer) included."""
    import transformers

    from peagle.target import Target

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path / "cache"))
    tiny_target().model.save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(machine, "auto_dtype_cpu",
                        lambda target, use_cache=True: machine.DtypeChoice(torch.bfloat16, "bfloat16: test"))
    measured = Target.from_pretrained(str(tmp_path / "tiny"), dtype="auto")
    loaded = Target.from_pretrained(str(tmp_path / "tiny"), dtype=torch.bfloat16)
    assert measured.dtype == loaded.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(measured.model.named_buffers(), loaded.model.named_buffers()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    ids = torch.randint(0, 200, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(measured.model(ids).logits, loaded.model(ids).logits)
