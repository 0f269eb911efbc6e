"""The docs' schema and prompt examples (docs/upstream.md, Prompt Cache) work as written."""

import json
import re

from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import Finish, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams

from tests.support.paths import REPO

PAGE = (REPO / "docs" / "upstream.md").read_text()


def test_the_schema_and_prompt_in_the_docs_serve() -> None:
    schema = re.search(r"```xml\n(<schema.*?</schema>)\n```", PAGE, re.S)
    request = re.search(r"```json\n(\{\"messages\".*?)\n```", PAGE, re.S)
    assert schema and request
    engine = PromptCacheEngine(load_model("builtin:tiny", device="cpu"))
    info = engine.add_schema(schema.group(1))
    assert set(info.modules) == {"manual", "torque-table", "owner", "brief", "detailed"}
    prepared = engine.prepare_messages(json.loads(request.group(1))["messages"])
    events = list(engine.generate(prepared, SamplingParams(max_tokens=2, temperature=0)))
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.cached_tokens > 0
