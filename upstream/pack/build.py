"""Answering predicted instructions with the upstream's own model, as the server would
answer them (its chat template, greedy), in a batch job that appends each answer to a
work file as it is made: a killed build resumes where it stopped. Then the pack."""

import datetime as dt
import json
import logging
from pathlib import Path

from meancache.shared.files import whole_lines
from meancache.shared.jsonl import jsonl_lines
from meancache.shared.pack import PackManifest, write_pack
from meancache.shared.progress import Progress
from meancache.upstream.model_loading import LoadedModel
from meancache.upstream.prompt_cache.engine import Delta, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams

log = logging.getLogger(__name__)


def answered_so_far(work_file: Path) -> dict[str, str]:
    """The answers a previous run wrote (a line cut by a kill is ignored)."""
    done: dict[str, str] = {}
    if work_file.exists():
        for _, line in jsonl_lines(work_file.read_text(encoding="utf-8")):
            try:
                row = json.loads(line)
                done[row["instruction"]] = row["answer"]
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a cut line in %s", work_file)
    return done


def answer_instructions(loaded: LoadedModel, instructions: list[str], work_file: Path,
                        max_tokens: int = 256,
                        progress: Progress | None = None) -> dict[str, str]:
    """instruction -> the model's answer, for every instruction."""
    engine = PromptCacheEngine(loaded)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    answers = answered_so_far(work_file)
    work_file.parent.mkdir(parents=True, exist_ok=True)
    whole_lines(work_file)
    with work_file.open("a", encoding="utf-8") as fh:
        for done, instruction in enumerate(instructions, start=1):
            if instruction not in answers:
                prepared = engine.prepare_messages([{"role": "user", "content": instruction}])
                answer = "".join(event.text for event in engine.generate(prepared, params)
                                 if isinstance(event, Delta))
                answers[instruction] = answer
                fh.write(json.dumps({"instruction": instruction, "answer": answer},
                                    ensure_ascii=False) + "\n")
                fh.flush()
            if progress is not None:
                progress(done, len(instructions))
    return {i: answers[i] for i in instructions}


def publish_pack(answers: dict[str, str], model: str, sigma: float,
                 packs_dir: Path) -> tuple[Path, PackManifest]:
    """Write the pack where `upstream serve --packs-dir` publishes it (empty answers are
    left out: the device would have nothing to show)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = packs_dir / f"pack-{stamp}.mcpack"
    return path, write_pack(path, answers.items(), model=model, sigma=sigma)
