"""vLLM's POST /tokenize and POST /detokenize: the ids the generation endpoints would prefill for a prompt
or a conversation (rendered by the chat format, chat_format.py), and the text of ids. Functions of the
served model (`Serving`); the routes are in routes.py."""

from __future__ import annotations

from blazr.server import request_in
from blazr.server.conversation import Conversation
from blazr.server.errors import bad_request
from blazr.server.schemas_server import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from blazr.server.serving import Serving


async def tokenize(s: Serving, req: TokenizeRequest | TokenizeChatRequest) -> TokenizeResponse:
    """The ids the generation endpoints would prefill for this prompt or conversation."""
    s.check_model(req.model)
    tok = s.tokenizer
    if isinstance(req, TokenizeChatRequest):
        ids = await s.off_loop(_render, s, req)
    else:
        s.check_prompt_chars(len(req.prompt), "prompt")
        ids = await s.off_loop(tok.encode, req.prompt)
        if not req.add_special_tokens and tok.add_bos and ids[:1] == [tok.bos_token_id]:
            ids = ids[1:]
    strs = [tok.token_text(i) for i in ids] if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=s.engine.max_model_len, tokens=ids, token_strs=strs)


async def detokenize(s: Serving, req: DetokenizeRequest) -> DetokenizeResponse:
    """The text of `req.tokens`, control tokens included (as vLLM's); an id past the vocabulary is a 400."""
    s.check_model(req.model)
    vocab = s.engine.vocab_size
    for i, t in enumerate(req.tokens):
        if t >= vocab:
            raise bad_request(f"token id {t} is out of range [0, {vocab})", f"tokens.{i}")
    return DetokenizeResponse(prompt=await s.off_loop(s.tokenizer.decode, req.tokens, False))


def _render(s: Serving, req: TokenizeChatRequest) -> list[int]:
    conv = Conversation(
        messages=request_in.chat_messages(req),
        tools=[t.model_dump(exclude_none=True) for t in req.tools or ()],
        thinking_budget=req.thinking_token_budget,
        reasoning_effort=req.reasoning_effort,
        template_kwargs=dict(req.chat_template_kwargs or {}),
        add_generation_prompt=req.add_generation_prompt,
    )
    return s.format.render(conv)
