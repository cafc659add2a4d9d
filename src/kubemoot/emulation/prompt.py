"""A prompt as an engine sees it: blocks of tokens with an identity, for truncation and
for the prompt-prefix cache.

An Ollama runner keeps, per slot, the tokens of the last prompt it evaluated there; a
new request on that slot evaluates only what follows the part it shares with them. Two
prompts share a prefix when they begin with the same tokens, so a prompt here is a run
of :class:`PromptBlock` — a message, the tool definitions, a turn of a simulated thread
— each with a ``key`` that is equal exactly when the block's tokens are. The shared
prefix of two prompts is the tokens of their leading blocks with equal keys; a block
that differs ends it (the engine compares tokens, and a changed block changes them
from there on).

The engine cuts an over-long prompt silently (:meth:`Prompt.fit`): pinned blocks
(system messages, tool definitions) and the newest block stay, the oldest others go
first, and when even that does not fit the oldest tokens go. A cut prompt starts with
other tokens than the one sent, so it shares no prefix with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FittedPrompt", "Prompt", "PromptBlock", "fit_to_context"]


@dataclass(frozen=True, slots=True)
class PromptBlock:
    """Some tokens of a prompt; ``key`` is equal for two blocks exactly when their tokens
    are (a hash of a message's text, or a simulated thread's turn number)."""

    key: str
    tokens: int
    pinned: bool = False  # a system message or tool definitions: truncation keeps it


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    """What the engine evaluates of a prompt for a context length."""

    prompt: Prompt  # the blocks kept (one block of new identity when tokens were cut)
    kept: tuple[int, ...]  # indexes of the blocks kept, oldest first
    tokens_sent: int  # the whole prompt as sent
    tokens: int  # what is evaluated: at most the context length

    @property
    def truncated(self) -> bool:
        return self.tokens < self.tokens_sent


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt's blocks, oldest first (see the module docstring)."""

    blocks: tuple[PromptBlock, ...] = ()

    @classmethod
    def of(cls, *blocks: tuple[str, int]) -> Prompt:
        """A prompt from ``(key, tokens)`` pairs, none pinned."""
        return cls(tuple(PromptBlock(key, tokens) for key, tokens in blocks))

    @classmethod
    def thread(cls, thread: str, turns: Sequence[int], *, system: int = 0) -> Prompt:
        """A conversation re-sent whole: ``system`` tokens of instructions (pinned),
        then each earlier turn of ``thread`` (``turns[k]`` tokens for turn ``k``). Two
        calls of one thread share every turn the shorter one holds."""
        head = (PromptBlock(f"{thread}#system", system, pinned=True),) if system else ()
        return cls(head + tuple(PromptBlock(f"{thread}#{k}", tokens)
                                for k, tokens in enumerate(turns)))

    @property
    def tokens(self) -> int:
        return sum(block.tokens for block in self.blocks)

    def shared_prefix(self, other: Prompt | None) -> int:
        """Tokens at the start of this prompt that ``other`` holds too."""
        if other is None:
            return 0
        shared = 0
        for mine, theirs in zip(self.blocks, other.blocks, strict=False):
            if mine.key != theirs.key or mine.tokens != theirs.tokens:
                break
            shared += mine.tokens
        return shared

    def fit(self, context_length: int | None) -> FittedPrompt:
        """The engine's silent cut to ``context_length`` (None: no limit)."""
        sent = self.tokens
        everything = tuple(range(len(self.blocks)))
        if context_length is None or sent <= context_length:
            return FittedPrompt(self, everything, sent, sent)
        kept, _, evaluated = fit_to_context([b.tokens for b in self.blocks],
                                            [b.pinned for b in self.blocks], 0,
                                            context_length)
        blocks = tuple(self.blocks[i] for i in kept)
        if sum(b.tokens for b in blocks) > evaluated:
            # the oldest tokens were cut too: what remains starts with other tokens
            digest = hashlib.sha256("\n".join(b.key for b in blocks).encode()).hexdigest()
            blocks = (PromptBlock(f"cut:{evaluated}:{digest[:16]}", evaluated),)
        return FittedPrompt(Prompt(blocks), tuple(kept), sent, evaluated)


def fit_to_context(sizes: Sequence[int], system: Sequence[bool], fixed_tokens: int,
                   context_length: int) -> tuple[list[int], int, int]:
    """The engine's silent cut of an over-long prompt, on token counts.

    ``sizes`` are the messages' tokens, ``system`` marks system messages and
    ``fixed_tokens`` is what cannot be dropped (tool definitions). System messages and
    the newest message stay; the oldest others go first; when even that does not fit,
    the oldest tokens are cut. Returns the kept indexes, the tokens before and the
    tokens evaluated.
    """
    before = fixed_tokens + sum(sizes)
    kept = list(range(len(sizes)))
    droppable = [i for i in kept[:-1] if not system[i]]
    total = before
    while total > context_length and droppable:
        victim = droppable.pop(0)
        kept.remove(victim)
        total -= sizes[victim]
    return kept, before, min(total, context_length)
