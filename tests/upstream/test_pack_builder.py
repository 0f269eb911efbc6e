"""The pack builder on tiny models and a few dozen real instructions: the instruction LM
(from scratch and from a base model; checkpoints and resume), Algorithm 1's tree search
(budget, depth, resume), sizing and hit-rate prediction, answers and the published pack."""

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from meancache.shared.errors import PackError
from meancache.shared.pack import read_pack
from meancache.upstream.model_loading import load_model
from meancache.upstream.pack.build import answer_instructions, publish_pack
from meancache.upstream.pack.data import read_instructions, split_instructions
from meancache.upstream.pack.lm import META_FILE, TrainConfig, load_lm, train_lm, wrap
from meancache.upstream.pack.nll import instruction_nll
from meancache.upstream.pack.plan import SizeModel, predicted_hit_rate, sigma_for_hit_rate
from meancache.upstream.pack.search import SearchConfig, tree_search

TINY = TrainConfig(epochs=20, batch_size=8, layers=1, hidden=64, heads=2, vocab_size=300,
                   max_tokens=16, checkpoint_every=4, learning_rate=3e-3)
SEARCH = SearchConfig(sigma=12.0, max_depth=12, limits=((2, 6), (10**9, 3)), batch_size=64)


class Killed(Exception):
    """Stands for a kill -9 at a chosen point of a long job."""


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: more threads only contend (10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def instructions_file(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 40 Chatbot Arena instructions."""
    lines = (shared_data_dir / "instructions" / "arena_first_turns.jsonl").read_text(
        encoding="utf-8").splitlines()[:40]
    path = tmp_path_factory.mktemp("instructions") / "arena40.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def scratch_lm(instructions_file: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Path, list[int]]:
    """A from-scratch LM whose first run is killed after step 6 and then resumed."""
    out = tmp_path_factory.mktemp("lm") / "scratch"
    steps: list[int] = []

    def kill_at_six(done: int, total: int) -> None:
        steps.append(done)
        if done == 6:
            raise Killed

    with pytest.raises(Killed):
        train_lm(instructions_file, out, config=TINY, progress=kill_at_six)
    train_lm(instructions_file, out, config=TINY, progress=lambda d, t: steps.append(d))
    return out, steps


def test_data_is_normalised_and_split_80_10_10(instructions_file: Path, tmp_path: Path) -> None:
    texts = read_instructions(instructions_file)
    assert len(texts) == 40 and texts[0] == "how to build an arena for chatbots"
    split = split_instructions(texts, seed=3)
    assert (len(split.train), len(split.validation), len(split.test)) == (32, 4, 4)
    assert sorted(split.train + split.validation + split.test) == sorted(texts)
    assert split == split_instructions(texts, seed=3) != split_instructions(texts, seed=4)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"no text": 1}\n')
    with pytest.raises(PackError, match=r"bad\.jsonl:2:"):
        read_instructions(bad)


def test_training_from_scratch_resumes_from_its_checkpoint(scratch_lm: tuple[Path, list[int]]
                                                           ) -> None:
    out, steps = scratch_lm
    # 32 train instructions / 8 = 4 steps an epoch, 80 in all; the kill came after step 6,
    # the last checkpoint was step 4, so the second run went on from step 5.
    assert steps == [1, 2, 3, 4, 5, 6, *range(5, 81)]
    meta = json.loads((out / META_FILE).read_text())
    assert (meta["base"], meta["steps"], meta["train"]) == (None, 80, 32)
    assert not out.with_name("scratch.checkpoint").exists()
    lm = load_lm(out)
    assert lm.model.config.model_type == "gpt2"


def test_fine_tuning_a_base_model_learns_the_instructions(instructions_file: Path,
                                                          tmp_path: Path) -> None:
    train = split_instructions(read_instructions(instructions_file)).train[:8]
    loaded = load_model("builtin:tiny-gemma3", device="cpu")
    before = instruction_nll(wrap(loaded.model, loaded.tokenizer), train, max_depth=10**4)
    config = TrainConfig(epochs=3, batch_size=8, learning_rate=3e-3, max_tokens=200)
    out = train_lm(instructions_file, tmp_path / "gemma", base="builtin:tiny-gemma3",
                   config=config)
    tuned = load_lm(out)
    assert tuned.model.config.model_type == "gemma3_text"
    after = instruction_nll(tuned, train, max_depth=10**4)
    assert sum(after) < sum(before)


def test_a_base_model_on_a_subset_with_its_embedding_frozen_resumes(
        instructions_file: Path, tmp_path: Path) -> None:
    config = TrainConfig(epochs=2, batch_size=4, learning_rate=3e-3, max_tokens=16, limit=8,
                         freeze_embeddings=True, checkpoint_every=2)
    out = tmp_path / "gemma"
    steps: list[int] = []

    def kill_at_three(done: int, total: int) -> None:
        steps.append(done)
        if done == 3:
            raise Killed

    with pytest.raises(Killed):
        train_lm(instructions_file, out, "builtin:tiny-gemma3", config, kill_at_three)
    saved = load_lm(out.with_name("gemma.checkpoint")).model
    train_lm(instructions_file, out, "builtin:tiny-gemma3", config,
             lambda d, t: steps.append(d))
    assert steps == [1, 2, 3, 3, 4]  # 8 instructions / 4 = 2 steps an epoch, 4 in all
    meta = json.loads((out / META_FILE).read_text())
    assert (meta["train"], meta["steps"]) == (8, 4) and meta["seconds"] > 0
    tuned = load_lm(out).model
    assert torch.equal(tuned.get_input_embeddings().weight,
                       saved.get_input_embeddings().weight)
    assert any(not torch.equal(a, b) for (name, a), b in zip(
        tuned.named_parameters(), saved.parameters(), strict=True) if "embed" not in name)


@pytest.fixture(scope="module")
def float64_lm(scratch_lm: tuple[Path, list[int]], tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    """The scratch LM saved in float64, for the tests that compare two searches. Those
    batch and reuse KV states in other shapes, so float32 sums differ by ~1e-6 between
    them: a path whose NLL lies that close to the budget, or to a sibling's at the
    children limit, could be kept by one search and not the other on some CPU. In float64
    the differences are ~1e-15, below any gap the searches meet."""
    out = tmp_path_factory.mktemp("lm64") / "scratch"
    lm = load_lm(scratch_lm[0])
    lm.model.double().save_pretrained(out)
    lm.tokenizer.save_pretrained(out)
    return out


# The two searches below compare searches that batch and reuse KV states in other shapes
# (numeric kernels' results): CI runs them on AVX2 kernels too. The Ray test's subtrees are
# the same comparison in other processes; its own subject is distribution and resume.
@pytest.mark.kernels
def test_tree_search_keeps_to_the_budget_and_resumes(float64_lm: Path, tmp_path: Path) -> None:
    lm = load_lm(float64_lm)
    assert lm.model.dtype == torch.float64
    whole = tree_search(lm, SEARCH)
    assert whole.instructions and whole.expanded > len(whole.instructions)
    assert max(whole.instructions.values()) <= SEARCH.sigma
    # The path NLLs the search summed with reused KV states are the model's own NLLs.
    direct = instruction_nll(lm, list(whole.instructions), SEARCH.max_depth)
    agree = [t for t, n in zip(whole.instructions, direct, strict=True)
             if math.isclose(n, whole.instructions[t], abs_tol=1e-3)]
    assert len(agree) >= len(whole.instructions) // 2  # the rest tokenise differently
    smaller = tree_search(lm, SearchConfig(9.0, SEARCH.max_depth, SEARCH.limits))
    assert smaller.instructions
    assert set(smaller.instructions) <= set(whole.instructions)

    state = tmp_path / "search.json"

    def kill_at_depth_three(done: int, total: int) -> None:
        if done == 3:
            raise Killed

    with pytest.raises(Killed):
        tree_search(lm, SEARCH, state, kill_at_depth_three)
    resumed = tree_search(lm, SEARCH, state)  # recomputes the frontier's KV states
    assert resumed.instructions.keys() == whole.instructions.keys()
    # float64 sums of <= 12 log-probabilities in two orders: ~1e-13 apart; 1e-4 is loose.
    assert all(math.isclose(resumed.instructions[t], n, abs_tol=1e-4)
               for t, n in whole.instructions.items())


@pytest.mark.kernels
def test_a_narrow_kv_budget_finds_the_same_holding_few_paths_states(
        float64_lm: Path) -> None:
    lm = load_lm(float64_lm)
    whole = tree_search(lm, SEARCH)
    narrow = tree_search(lm, replace(SEARCH, batch_size=4, kv_paths=8))
    assert narrow.instructions.keys() == whole.instructions.keys()
    assert all(math.isclose(narrow.instructions[t], n, abs_tol=1e-4)
               for t, n in whole.instructions.items())
    assert narrow.expanded == whole.expanded
    # At most the incoming level, the rows collected for the next and one batch.
    assert narrow.peak_kv <= 3 * 8 + 2 * 4 < whole.peak_kv


def test_size_fit_and_hit_rate_prediction() -> None:
    model = SizeModel.fit(2.0, 10, 4.0, 60)
    assert math.isclose(model.size(2.0), 10) and math.isclose(model.size(4.0), 60)
    assert model.size(6.0) > 60 * 5  # exponential growth beyond the fitted points
    nlls = [1.0, 2.0, 3.0, 4.0, math.inf]
    assert predicted_hit_rate(nlls, 3.0) == 0.6
    assert sigma_for_hit_rate(nlls, 0.6) == 3.0
    with pytest.raises(PackError, match="out of reach"):
        sigma_for_hit_rate(nlls, 0.9)
    with pytest.raises(PackError, match="larger sigmas"):
        SizeModel.fit(2.0, 5, 4.0, 5)


def test_answers_resume_and_the_published_pack_is_the_models(tmp_path: Path) -> None:
    loaded = load_model("builtin:tiny", device="cpu")
    work = tmp_path / "answers.jsonl"
    kept = "kept\u2028across a line separator"  # written raw (ensure_ascii=False)
    work.write_text(json.dumps({"instruction": "what is python", "answer": kept},
                               ensure_ascii=False) + "\n" + '{"instruction": "cut by a ki',
                    encoding="utf-8")
    answers = answer_instructions(loaded, ["what is python", "how are you"], work,
                                  max_tokens=4)
    assert answers["what is python"] == kept  # answered by the killed run: not redone
    rows = [json.loads(line) for line in work.read_text(encoding="utf-8").split("\n")
            if line]  # the cut line is gone
    assert [r["instruction"] for r in rows] == ["what is python", "how are you"]
    path, manifest = publish_pack(answers | {"hi": "x"}, loaded.name, 9.0, tmp_path / "packs")
    pack = read_pack(path, model="builtin:tiny")
    assert pack.manifest == manifest and pack.lookup("What is Python?")[1] == kept


def test_commands_train_plan_build_then_the_device_updates(
        instructions_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from meancache.upstream.server.app import ServerSettings

    from meancache.cli import main
    from tests.support.servers import running_upstream

    base = ["--config-dir", str(tmp_path / "config"), "--data-dir", str(tmp_path / "data")]
    lm, packs = tmp_path / "lm", tmp_path / "published"
    search = ["--lm", str(lm), "--max-depth", "12", "--children", "6", "3"]
    assert main([*base, "pack", "train-lm", "--data", str(instructions_file), "--out", str(lm),
                 "--epochs", "20", "--batch-size", "8", "--layers", "1", "--hidden", "64"]) == 0
    assert main([*base, "pack", "plan", *search, "--data", str(instructions_file),
                 "--fit-sigmas", "10", "13", "--sigma", "14", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert plan["fit"]["sizes"][0] < plan["fit"]["sizes"][1] < plan["predicted_size"]
    assert plan["validation_instructions"] == 4 and 0 <= plan["predicted_hit_rate"] <= 1
    assert main([*base, "pack", "build", *search, "--sigma", "12", "--model", "builtin:tiny",
                 "--packs-dir", str(packs), "--max-tokens", "4"]) == 0
    captured = capsys.readouterr()
    assert "published" in captured.out
    # stderr is not a terminal here: progress comes as lines, each step's last at 100%
    for line in ("search depth: 12/12 (100%)", "answering: "):
        assert line in captured.err, captured.err
    # Bars on the terminal; the log file has the progress of a job run in the background.
    logged = (tmp_path / "data" / "logs" / "meancache.log").read_text(encoding="utf-8")
    assert "training steps: 80/80" in logged and "search depth: 12/12" in logged
    assert "answering: " in logged
    [published] = packs.glob("*.mcpack")
    built = read_pack(published, model="builtin:tiny")
    assert built.manifest.count > 0 and built.manifest.sigma == 12.0
    assert main([*base, "pack", "plan", *search, "--data", str(instructions_file),
                 "--fit-sigmas", "10", "13", "--sigma", "14", "--packs-dir", str(packs),
                 "--json"]) == 0
    checked = json.loads(capsys.readouterr().out.splitlines()[-1])["last_build"]
    assert (checked["pack_id"], checked["sigma"], checked["count"]) == (
        built.manifest.pack_id, 12.0, built.manifest.count)
    assert checked["ratio"] == pytest.approx(checked["predicted"] / built.manifest.count)
    with running_upstream(settings=ServerSettings(packs_dir=packs)) as url:
        assert main([*base, "pack", "update", "--upstream", url]) == 0
    assert main([*base, "pack", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (stats["pack_id"], stats["entries"]) == (built.manifest.pack_id,
                                                    built.manifest.count)


def start_ray(**options: object) -> None:
    """``ray.init``, tried again when the local node does not register in time: Ray waits a
    fixed 30 s for its raylet (ray/_private/node.py), which CI's 2 cores, shared by the
    suite's workers and the kernels rerun, can exceed while the suite starts up."""
    import ray

    for attempt in range(3):
        try:
            ray.init(**options)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            ray.shutdown()


@pytest.mark.slow(100)
def test_ray_subtrees_find_what_one_process_finds_and_resume_after_a_kill(
        float64_lm: Path, tmp_path: Path) -> None:
    import ray
    from meancache.upstream.pack.parallel import parallel_search

    one = tree_search(load_lm(float64_lm), SEARCH)
    job = tmp_path / "ray-job"

    def kill_after_two(done: int, total: int) -> None:
        if done == 2:
            raise Killed

    start_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)  # one for all
    try:
        spread = parallel_search(float64_lm, SEARCH, workers=2, split_depth=2)
        with pytest.raises(Killed):
            parallel_search(float64_lm, SEARCH, workers=2, work_dir=job,
                            progress=kill_after_two)
        finished = {p: p.stat().st_mtime_ns for p in job.glob("subtree-*.json")}
        assert len(finished) == 2
        done: list[tuple[int, int]] = []
        resumed = parallel_search(float64_lm, SEARCH, workers=3, work_dir=job,
                                  progress=lambda d, t: done.append((d, t)))
    finally:
        ray.shutdown()
    groups = done[-1][1]
    assert done[0] == (2, groups) and done[1][0] == 3  # the two finished groups not rerun
    assert groups == 8  # the first run's grouping (2 workers), though 3 were asked now
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
    assert len(list(job.glob("subtree-*.json"))) == groups
    for found in (spread, resumed):
        assert found.instructions.keys() == one.instructions.keys()
        assert all(math.isclose(found.instructions[t], n, abs_tol=1e-4)
                   for t, n in one.instructions.items())
        assert found.expanded == one.expanded


def test_a_depth_beyond_the_lms_positions_is_refused_in_one_line(
        scratch_lm: tuple[Path, list[int]], instructions_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The scratch LM has TINY.max_tokens + 2 positions: a deeper search or NLL would run
    off GPT-2's position table (an IndexError before), so plan and build say so first."""
    from meancache.cli import main

    base = ["--config-dir", str(tmp_path / "config"), "--data-dir", str(tmp_path / "data")]
    deepest = TINY.max_tokens
    for command in (["plan", "--data", str(instructions_file), "--sigma", "8",
                     "--fit-sigmas", "6", "8"],
                    ["build", "--sigma", "8", "--packs-dir", str(tmp_path / "packs")]):
        assert main([*base, "pack", *command, "--lm", str(scratch_lm[0]), "--max-depth",
                     str(deepest + 1)]) == 2
        err = capsys.readouterr().err
        assert f"at most --max-depth {deepest}" in err and "Traceback" not in err
    load_lm(scratch_lm[0]).check_depth(deepest)  # the deepest it has positions for is fine
