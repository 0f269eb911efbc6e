"""User text is text: a message, a document or an argument that spells a special token
(``<start_of_turn>``, ``<end_of_turn>``, ``<bos>``, a role tag) must never become that
token's id, or a document could open a turn of its own. Only the chat template and the PML
role tags (the markup) produce special tokens.

Content alone is tokenised with ``split_special_tokens``. Where content has to pass through
the chat template with the markup, each special token the tokenizer would find in it is
first replaced by a private-use placeholder character; after rendering, the placeholders
are tokenised as the plain text they stand for. Text without special tokens tokenises
exactly as before."""

import re

from transformers import PreTrainedTokenizerBase

_FIRST_PLACEHOLDER = 0xF0000  # Supplementary Private Use Area-A


class UserText:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special_ids = frozenset(
            {int(i) for i, token in tokenizer.added_tokens_decoder.items() if token.special}
            | set(tokenizer.all_special_ids))
        self._placeholder: dict[str, str] = {}  # special token text -> its placeholder
        self._text: dict[str, str] = {}  # and back

    def ids(self, text: str) -> list[int]:
        """Content's token ids: a special token spelled in it stays plain text."""
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False,
                                   split_special_tokens=True)["input_ids"])

    def escape(self, text: str) -> str:
        """``text`` with every special token the tokenizer would find in it replaced by a
        placeholder (``encode`` turns it back into plain text)."""
        found = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = [span for token, span in zip(found["input_ids"], found["offset_mapping"],
                                             strict=True) if token in self.special_ids]
        if not spans:
            return text
        pieces, last = [], 0
        for start, end in spans:
            pieces += [text[last:start], self._placeholder_of(text[start:end])]
            last = end
        return "".join([*pieces, text[last:]])

    def encode(self, rendered: str) -> list[int]:
        """Markup with escaped content in it: the markup's special tokens are tokens, the
        content's are text."""
        if not self._text:
            return list(self.tokenizer.encode(rendered, add_special_tokens=False))
        ids: list[int] = []
        for i, piece in enumerate(self._split.split(rendered)):
            if i % 2:
                ids += self.ids(self._text[piece])
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False)
        return ids

    def _placeholder_of(self, special: str) -> str:
        if special not in self._placeholder:
            mark = chr(_FIRST_PLACEHOLDER + len(self._placeholder))
            self._placeholder[special], self._text[mark] = mark, special
            self._split = re.compile(f"([{''.join(self._text)}])")
        return self._placeholder[special]
