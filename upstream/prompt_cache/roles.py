"""PML role tags rendered with the model's own chat template.

A template renders whole conversations, while a role tag wraps one piece of a schema. We
render conversations around sentinel strings and cut them apart to learn, for each role,
the text before and after a message's content, and the generation prompt.
"""

import logging
from dataclasses import dataclass

from meancache.upstream.builtin import CHAT_TEMPLATE
from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

_A, _B, _S = "\u2063MCA\u2063", "\u2063MCB\u2063", "\u2063MCS\u2063"


@dataclass(frozen=True)
class RoleTemplate:
    prefix: dict[str, str]
    suffix: dict[str, str]
    generation_prefix: str  # what opens the assistant's reply
    leading: str  # what a rendered conversation starts with (usually the BOS token)


def role_template(tokenizer: PreTrainedTokenizerBase) -> RoleTemplate:
    try:
        return _derive(tokenizer, tokenizer.chat_template)
    except Exception as exc:  # templates raise all sorts of errors for odd conversations
        log.warning("could not derive role tags from the chat template (%s); "
                    "using meancache's plain template", exc)
        return _derive(tokenizer, CHAT_TEMPLATE)


def _derive(tokenizer: PreTrainedTokenizerBase, template: str) -> RoleTemplate:
    def render(messages: list[dict[str, str]], generation: bool = False) -> str:
        return str(tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=generation
        ))

    system_only = render([{"role": "system", "content": _S}])
    leading, system_after = system_only.split(_S)
    bos = tokenizer.bos_token or ""
    system_prefix = leading
    leading = bos if bos and leading.startswith(bos) else ""
    system_prefix = system_prefix.removeprefix(leading)

    def after_system(messages: list[dict[str, str]], generation: bool = False) -> str:
        text = render([{"role": "system", "content": _A}, *messages], generation)
        return text[text.index(_A) + len(_A) + len(system_after):]

    user = after_system([{"role": "user", "content": _S}])
    assistant = after_system([{"role": "user", "content": _B},
                              {"role": "assistant", "content": _S}])
    assistant = assistant[assistant.index(_B) + len(_B):]
    user_suffix = user.split(_S)[1]
    assistant = assistant.removeprefix(user_suffix)
    with_prompt = after_system([{"role": "user", "content": _S}], generation=True)
    without = after_system([{"role": "user", "content": _S}])
    return RoleTemplate(
        prefix={"system": system_prefix, "user": user.split(_S)[0],
                "assistant": assistant.split(_S)[0]},
        suffix={"system": system_after, "user": user_suffix,
                "assistant": assistant.split(_S)[1]},
        generation_prefix=with_prompt.removeprefix(without),
        leading=leading,
    )
