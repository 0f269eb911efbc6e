"""Serving with Prompt Cache: imported modules' states are reused, so are the states of
the longest prefix of the new tokens that an earlier prompt of the same tenant computed
(automatic prefix reuse, see prompt_cache.prefixes); only the rest is computed, and
decoding continues from the highest position + 1."""

import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from meancache.shared.pml import (
    Import,
    Module,
    Prompt,
    PromptNode,
    Role,
    Schema,
    SchemaRegistry,
    Text,
    parse_prompt,
    parse_schema,
)
from meancache.upstream.errors import PromptTooLongError, UpstreamError
from meancache.upstream.kv_rounding import KVFormat
from meancache.upstream.model_loading import LoadedModel
from meancache.upstream.precision import DEFAULT_KV_FORMAT
from meancache.upstream.prompt_cache.kv_format import KVCache
from meancache.upstream.prompt_cache.layout import LEADING, SCHEMA_TEXT, SchemaLayout, lay_out
from meancache.upstream.prompt_cache.module_store import Key, ModuleStore
from meancache.upstream.prompt_cache.prefixes import BLOCK_TOKENS, chain, root
from meancache.upstream.prompt_cache.roles import role_template
from meancache.upstream.prompt_cache.states import (
    SegmentStates,
    attention_mask,
    bytes_per_token,
    concatenate,
    encode_segment,
    out_of_window,
    sliding_layers,
    sliding_window,
    stored_slice,
)
from meancache.upstream.prompt_cache.user_text import UserText
from meancache.upstream.sampling import History, SamplingParams, TextStream, next_token

Message = dict[str, str]

log = logging.getLogger(__name__)

#: The one tenant of a server without API keys (and of code that serves no network).
LOCAL_TENANT = "local"
#: Layouts of marked messages one tenant keeps (prepare_marked); their states share the
#: module store's budget and LRU with everything else.
MAX_MARKED_LAYOUTS = 64


def marked_namespace(tenant: str) -> str:
    """Where ``tenant``'s marked-message layouts are kept: '#' is in no schema name, so
    they meet no schema's key, and no other tenant's."""
    return f"#marked:{tenant}"


def schema_key(tenant: str, name: str) -> str:
    """Where a tenant's schema keeps its layout and module states. Schema names never hold
    ':', so two tenants' keys never meet; the local tenant's are the bare names."""
    return name if tenant == LOCAL_TENANT else f"{tenant}:{name}"


@dataclass(frozen=True)
class SchemaUsage:
    """What one tenant's schemas would hold after an add: checked against its quota."""

    schemas: int
    cached_tokens: int


@dataclass(frozen=True)
class SchemaInfo:
    name: str
    modules: tuple[str, ...]
    cached_tokens: int
    positions: int
    nbytes: int
    encode_seconds: float


@dataclass(frozen=True)
class PreparedPrompt:
    """What a request asks the model to read: reused segments and new tokens, for a tenant
    (whose cached prefixes alone it may read back)."""

    cached: tuple[Key, ...]
    new_ids: tuple[int, ...]
    new_positions: tuple[int, ...]
    tenant: str = LOCAL_TENANT
    marked_tokens: int = 0  # tokens of marked messages that are not held: computed first


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop", "length", "loop" (the loop stop ended it) or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # read back, not computed: module states and prefix blocks together
    ttft_seconds: float
    prefix_tokens: int = 0  # of those, read back from cached prefix blocks


class PromptCacheEngine:
    """One model, its schemas and their module states. Not re-entrant: the server runs
    one request at a time through it (see upstream.server.worker).

    Schemas belong to a tenant (an API key; :data:`LOCAL_TENANT` without keys): each
    tenant has its own registry, so it can neither see, use, replace nor remove another's
    schemas, and error messages list only its own names. The same holds for prefix reuse:
    a tenant reads back only the prefixes its own requests computed.

    ``prefix_reuse`` False computes every prompt's new tokens afresh (for comparison).
    ``kv_format`` is how attention states are held, computed and stored alike
    (upstream.kv_rounding)."""

    def __init__(self, loaded: LoadedModel, module_budget_bytes: int = 2 << 30,
                 prefix_reuse: bool = True, block_tokens: int = BLOCK_TOKENS,
                 kv_format: str = DEFAULT_KV_FORMAT) -> None:
        self.loaded = loaded
        self.kv_format = KVFormat(kv_format)
        self.prefix_reuse = prefix_reuse
        self.block_tokens = block_tokens
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.roles = role_template(self.tokenizer)
        self.user_text = UserText(self.tokenizer)
        self._registries: dict[str, SchemaRegistry] = {}
        self.layouts: dict[str, SchemaLayout] = {}  # by schema_key, and marked layouts' keys
        self._marked: dict[str, OrderedDict[str, None]] = {}  # a tenant's marked layouts, LRU
        self.modules = ModuleStore(module_budget_bytes)
        self.bytes_per_token = bytes_per_token(self.model, self.kv_format)
        self.sliding = sliding_layers(self.model.config)
        config = self.model.config
        if (getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
                and sliding_window(config) is None):  # Gemma 3's window is applied by the masks
            log.warning("%s uses sliding-window attention; module states are kept in full",
                        loaded.name)
        eos = {self.tokenizer.eos_token_id, *self._generation_eos()}
        self._eos = {i for i in eos if i is not None}

    def _generation_eos(self) -> list[int]:
        config = getattr(self.model, "generation_config", None)
        value = getattr(config, "eos_token_id", None)
        return value if isinstance(value, list) else [value] if value is not None else []

    def count_tokens(self, text: str) -> int:
        return len(self.user_text.ids(text))

    # schemas ------------------------------------------------------------------------
    def registry(self, tenant: str = LOCAL_TENANT) -> SchemaRegistry:
        """The schemas of ``tenant`` (empty for a tenant that has added none)."""
        return self._registries.setdefault(tenant, SchemaRegistry())

    def add_schema(self, source: str, tenant: str = LOCAL_TENANT,
                   admit: Callable[[SchemaUsage], None] | None = None) -> SchemaInfo:
        """Parse, lay out and encode every segment of a schema (replacing one of that name
        of the same tenant). ``admit`` sees what the tenant would then hold and raises to
        refuse it: first right after parsing (this schema's tokens not yet counted), so a
        key over its quota costs no tokenizing, then after layout, before any encoding."""
        schema = parse_schema(source)
        registry = self.registry(tenant)
        others = [self.layouts[schema_key(tenant, n)] for n in registry.list()
                  if n != schema.name]
        held = sum(other.cached_tokens for other in others)
        if admit is not None:
            admit(SchemaUsage(len(others) + 1, held))
        layout = lay_out(schema, self.user_text, self.roles)
        if layout.end >= self.loaded.context_length:
            raise PromptTooLongError(
                f"schema '{schema.name}' takes {layout.end} positions; the model's context "
                f"holds {self.loaded.context_length}; shorten its modules or serve a model "
                "with a longer context"
            )
        if admit is not None:
            admit(SchemaUsage(len(others) + 1, held + layout.cached_tokens))
        key = schema_key(tenant, schema.name)
        registry.add(schema, replace=True)
        self.modules.drop_schema(key)
        self.layouts[key] = layout
        start = time.perf_counter()
        for segment_key, segment in layout.segments.items():
            if len(segment):
                self._states((key, segment_key))
        return self.schema_info(schema.name, tenant, time.perf_counter() - start)

    def remove_schema(self, name: str, tenant: str = LOCAL_TENANT) -> None:
        self.registry(tenant).remove(name)
        self.layouts.pop(schema_key(tenant, name), None)
        self.modules.drop_schema(schema_key(tenant, name))

    def schema_info(self, name: str, tenant: str = LOCAL_TENANT,
                    encode_seconds: float = 0.0) -> SchemaInfo:
        layout = self.layouts[schema_key(tenant, self.registry(tenant).get(name).name)]
        return SchemaInfo(
            name, tuple(layout.schema.modules()), layout.cached_tokens, layout.end,
            layout.cached_tokens * self.bytes_per_token, encode_seconds,
        )

    def schema_infos(self, tenant: str = LOCAL_TENANT) -> list[SchemaInfo]:
        """Every schema of ``tenant``, by name."""
        return [self.schema_info(name, tenant) for name in self.registry(tenant).list()]

    def _states(self, key: Key, pinned: frozenset[Key] = frozenset()) -> SegmentStates:
        layout = self.layouts[key[0]]
        segment = layout.segments[key[1]]

        def encode() -> SegmentStates:
            leading = None
            if key[1] != LEADING and len(layout.segments[LEADING]):
                leading = self._states((key[0], LEADING), pinned | {key})
            return encode_segment(self.model, self.kv_format, segment.token_ids,
                                  segment.positions, leading)

        return self.modules.get(key, encode, pinned)

    # prompts ------------------------------------------------------------------------
    def prepare_messages(self, messages: list[Message],
                         tenant: str = LOCAL_TENANT) -> PreparedPrompt:
        """A chat request. If the last message is a PML ``<prompt>``, its modules are reused
        and the earlier messages become role-tagged text before the prompt's own text;
        otherwise the conversation is rendered with the chat template and nothing is reused."""
        if not messages:
            raise UpstreamError("messages must not be empty; send at least one message")
        last = messages[-1].get("content", "")
        if last.lstrip().startswith("<prompt"):
            return self.prepare_pml(parse_prompt(last), messages[:-1], tenant)
        escaped = [{**m, "content": self.user_text.escape(m.get("content", ""))}
                   for m in messages]
        rendered = self.tokenizer.apply_chat_template(
            escaped, tokenize=False, add_generation_prompt=True)
        ids = self.user_text.encode(str(rendered))
        return PreparedPrompt((), tuple(ids), tuple(range(len(ids))), tenant)

    def prepare_pml_source(self, source: str) -> PreparedPrompt:
        return self.prepare_pml(parse_prompt(source))

    def prepare_pml(self, prompt: Prompt, history: list[Message] = (),  # type: ignore[assignment]
                    tenant: str = LOCAL_TENANT) -> PreparedPrompt:
        schema = self.registry(tenant).resolve(prompt, self.count_tokens)
        return self._prepare(schema_key(tenant, schema.name), prompt.imports(), history,
                             prompt.children, tenant)

    def prepare_marked(self, messages: list[Message], marked: tuple[int, ...],
                       tenant: str = LOCAL_TENANT) -> PreparedPrompt:
        """A chat request whose messages at ``marked`` (shared.pml.marks) are kept as
        modules: an implicit schema of one module per marked message, in their order, with
        the other messages as text after it. The same marked messages in a later request,
        whatever history surrounds them, read their states back."""
        if messages[-1].get("content", "").lstrip().startswith("<prompt"):
            raise UpstreamError("a request that marks modules cannot end in a PML <prompt>; "
                                "send one or the other")
        picked = [messages[i] for i in marked]
        digest = hashlib.sha256(json.dumps([[m["role"], m["content"]] for m in picked]
                                           ).encode()).hexdigest()
        key = f"{marked_namespace(tenant)}:{digest}"
        if key not in self.layouts:
            modules = tuple(Module(f"m{i}", (Role(m["role"], (Text(m["content"]),)),))  # type: ignore[arg-type]
                            for i, m in enumerate(picked))
            self._keep_marked(tenant, key, lay_out(Schema(key, modules), self.user_text,
                                                   self.roles))
        self._marked[tenant].move_to_end(key)
        imports = [Import(f"m{i}", {}, ()) for i in range(len(picked))]
        skip = set(marked)
        history = [m for i, m in enumerate(messages) if i not in skip]
        prepared = self._prepare(key, imports, history, (), tenant)
        segments = self.layouts[key].segments
        to_encode = sum(len(segments[part]) for part in segments
                        if (key, part) not in self.modules)
        return dataclasses.replace(prepared, marked_tokens=to_encode)

    def _keep_marked(self, tenant: str, key: str, layout: SchemaLayout) -> None:
        """Hold the layout of a tenant's marked messages; past :data:`MAX_MARKED_LAYOUTS`
        the least recently used goes, with its states."""
        if layout.end >= self.loaded.context_length:
            raise PromptTooLongError(
                f"the marked messages take {layout.end} positions; the model's context holds "
                f"{self.loaded.context_length}: mark less")
        held = self._marked.setdefault(tenant, OrderedDict())
        held[key] = None
        self.layouts[key] = layout
        while len(held) > MAX_MARKED_LAYOUTS:
            old, _ = held.popitem(last=False)
            del self.layouts[old]
            self.modules.drop_schema(old)

    def _prepare(self, key: str, top: Iterable[Import], history: Iterable[Message],
                 children: Iterable[PromptNode], tenant: str) -> PreparedPrompt:
        """The prompt that imports ``top`` (and their imports) of the layout at ``key``,
        with ``history`` and ``children`` as text after the schema."""
        layout = self.layouts[key]
        imports: list[Import] = []
        pending = list(top)
        while pending:
            item = pending.pop(0)
            imports.append(item)
            pending.extend(item.children)
        imported = {i.name for i in imports}
        cached = [(key, part) for part, segment in layout.segments.items()
                  if len(segment) and (part in (LEADING, SCHEMA_TEXT) or part in imported)]
        ids: list[int] = []
        positions: list[int] = []
        for item in imports:  # arguments at their parameters' reserved positions
            for name, arg in item.args.items():
                slot = layout.params[(item.name, name)]
                arg_ids = self.user_text.ids(arg)[: slot.length]
                ids.extend(arg_ids)
                positions.extend(range(slot.start, slot.start + len(arg_ids)))
        escape = self.user_text.escape
        text = "".join(
            self.roles.prefix[m["role"]] + escape(m["content"]) + self.roles.suffix[m["role"]]
            for m in history
        )
        for node in children:
            if isinstance(node, Text):
                text += escape(node.text)
            elif isinstance(node, Role):
                inner = escape("".join(child.text for child in node.children))
                text += self.roles.prefix[node.role] + inner + self.roles.suffix[node.role]
        text += self.roles.generation_prefix
        new = self.user_text.encode(text)
        ids.extend(new)
        positions.extend(range(layout.end, layout.end + len(new)))
        return PreparedPrompt(tuple(cached), tuple(ids), tuple(positions), tenant)

    def prompt_ids(self, prepared: PreparedPrompt) -> list[int]:
        """Every token the model reads for ``prepared``, reused or new, in position order:
        what the repetition guard looks back over, so that a reused module and the same
        tokens read afresh are guarded alike."""
        placed = [(position, token) for key, part in prepared.cached
                  for position, token in zip(self.layouts[key].segments[part].positions,
                                             self.layouts[key].segments[part].token_ids,
                                             strict=True)]
        placed += zip(prepared.new_positions, prepared.new_ids, strict=True)
        return [token for _, token in sorted(placed, key=lambda pair: pair[0])]

    # generation ---------------------------------------------------------------------
    def prefill(self, prepared: PreparedPrompt) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
        """Logits after the prompt, the positions read so far, and the filled cache."""
        logits, seen, cache, _ = self._prefill(prepared)
        return logits, seen, cache

    @torch.inference_mode()
    def _prefill(self, prepared: PreparedPrompt
                 ) -> tuple[torch.Tensor, torch.Tensor, KVCache, int]:
        """As :meth:`prefill`, and how many new tokens were read back from prefix blocks.

        The new tokens are read in position order (a PML argument sits before the text
        after the schema): a token's states depend only on what lies before it, so a
        block's hash chain covers everything its states depend on."""
        if not prepared.new_ids:
            raise UpstreamError("the prompt adds no text after its modules; end it with a "
                                "<user> question")
        pinned = frozenset(prepared.cached)
        states = [self._states(key, pinned) for key in prepared.cached]
        ordered = sorted(zip(prepared.new_positions, prepared.new_ids, strict=True))
        new_positions = [position for position, _ in ordered]
        new_ids = [token for _, token in ordered]
        blocks = self._blocks(prepared, new_ids, new_positions)
        found = self._found(blocks[: (len(new_ids) - 1) // self.block_tokens])
        reused = len(found) * self.block_tokens
        held = states + found
        skip = out_of_window(torch.cat([s.positions for s in held]) if held else torch.empty(0),
                             new_positions[reused], sliding_window(self.model.config))
        cache, cached_positions = concatenate(held, self.kv_format, self.sliding, skip)
        device = self.loaded.device
        ids = torch.tensor([new_ids[reused:]], device=device)
        positions = torch.tensor(new_positions[reused:], device=device)
        # A new token sees the cached tokens before it, and the new tokens up to itself.
        sees_cached = cached_positions.to(device)[None, :] < positions[:, None]
        sees_new = positions[None, :] <= positions[:, None]
        allowed = torch.cat([sees_cached, sees_new], dim=1)
        seen = torch.cat([cached_positions.to(device), positions])
        out = self.model(input_ids=ids, position_ids=positions[None],
                         attention_mask=attention_mask(self.model, allowed, positions, seen,
                                                       cache.sliding_skip),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        self._keep(cache, blocks, len(found), new_positions, pinned, states)
        return out.logits[0, -1], seen, cache, reused

    def _blocks(self, prepared: PreparedPrompt, ids: list[int], positions: list[int]
                ) -> list[Key]:
        """The keys of the whole blocks of the new tokens (none with reuse off)."""
        if not self.prefix_reuse:
            return []
        segments = [(part, self.layouts[schema].segments[part].token_ids,
                     self.layouts[schema].segments[part].positions)
                    for schema, part in prepared.cached]
        start = root(self.loaded.name, segments)
        return chain(start, prepared.tenant, ids, positions, self.block_tokens)

    def _found(self, blocks: list[Key]) -> list[SegmentStates]:
        """The states of the longest run of ``blocks`` held, from the first."""
        found = []
        for key in blocks:
            states = self.modules.find(key)
            if states is None:
                break
            found.append(states)
        return found

    def _keep(self, cache: KVCache, blocks: list[Key], reused: int, positions: list[int],
              pinned: frozenset[Key], modules: list[SegmentStates]) -> None:
        """Hold the blocks computed now, as many as fit in the budget beside the modules
        this prompt reads (a chain longer than that keeps its start), then count the
        prompt's chain as used, deepest block first: eviction takes a chain's tail first."""
        base = sum(states.tokens for states in modules)  # where the new tokens start
        room = self.modules.budget_bytes - sum(states.nbytes for states in modules)
        size = self.block_tokens
        kept = reused
        for index in range(reused, len(blocks)):
            first = index * size
            block = stored_slice(cache, self.kv_format, base + first, base + first + size,
                                 torch.tensor(positions[first:first + size]))
            if (index + 1) * block.nbytes > room:
                break
            self.modules.put(blocks[index], block, pinned | frozenset(blocks[:index]))
            kept = index + 1
        self.modules.touch(reversed(blocks[:kept]))

    def new_cache(self) -> KVCache:
        """An empty cache in the engine's KV format (what a reference forward pass over a
        whole prompt needs to read the states a request reads)."""
        return KVCache(self.kv_format)

    @torch.inference_mode()
    def decode_step(self, token: int, position: int, seen: torch.Tensor, cache: KVCache
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits after ``token`` read at ``position`` (it sees every position in ``seen``
        and itself), and ``seen`` with that position added."""
        if self.loaded.decoder is not None:
            return self.loaded.decoder.step(token, position, seen, cache, self.kv_format,
                                            cache.sliding_skip)
        device = self.loaded.device
        at = torch.tensor([position], device=device)
        seen = torch.cat([seen, at])
        allowed = torch.ones(1, seen.numel(), dtype=torch.bool, device=device)
        out = self.model(input_ids=torch.tensor([[token]], device=device),
                         position_ids=at[None],
                         attention_mask=attention_mask(self.model, allowed, at, seen,
                                                       cache.sliding_skip),
                         past_key_values=cache, use_cache=True)
        return out.logits[0, -1], seen

    def check_fits(self, prepared: PreparedPrompt, params: SamplingParams) -> None:
        """Raise PromptTooLongError if the prompt plus max_tokens passes the context."""
        last = max(prepared.new_positions, default=0)
        if last + params.max_tokens >= self.loaded.context_length:
            raise PromptTooLongError(
                f"the prompt reaches position {last} and asks for {params.max_tokens} more "
                f"tokens; the model's context holds {self.loaded.context_length}: lower "
                "max_tokens or shorten the prompt"
            )

    @torch.inference_mode()
    def generate(self, prepared: PreparedPrompt, params: SamplingParams,
                 cancel: threading.Event | None = None) -> Iterator[Delta | Finish]:
        start = time.perf_counter()
        self.check_fits(prepared, params)
        last = max(prepared.new_positions, default=0)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.loaded.device).manual_seed(params.seed)
        logits, seen, cache, reused = self._prefill(prepared)
        # marked messages encoded by this very request were computed, not read back
        cached_tokens = seen.numel() - len(prepared.new_ids) + reused - prepared.marked_tokens
        prompt_tokens = seen.numel()
        stream = TextStream(self.tokenizer, params.stop + self.loaded.stop)
        history = History(self.prompt_ids(prepared), params)
        token = next_token(history.penalise(logits), params, generator)
        ttft = time.perf_counter() - start
        produced, reason = 0, "length"
        while True:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            produced += 1
            if token in self._eos:
                reason = "stop"
                break
            text = stream.push(token)
            if text:
                yield Delta(text)
            if stream.stopped:
                reason = "stop"
                break
            history.add(token)
            if history.looping:
                reason = "loop"
                break
            if produced >= params.max_tokens:
                break
            last += 1
            logits, seen = self.decode_step(token, last, seen, cache)
            token = next_token(history.penalise(logits), params, generator)
        tail = stream.flush()
        if tail:
            yield Delta(tail)
        yield Finish(reason, prompt_tokens, produced, cached_tokens, ttft, reused)
