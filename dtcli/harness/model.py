"""lm-evaluation-harness's model interface over a dtcli language-model session (`SessionLM`):
its three request types on the session's mesh, in process.

- loglikelihood: each (context, continuation) encoded as lm-eval encodes it (TemplateLM's
  `_encode_pair`: the whole text once, the continuation the tokens past the context's own
  encoding), cut and batched in a few fixed shapes (requests.py), scored by infer/logprobs.py: the
  sum of the continuation's log probabilities and whether each of its tokens is the argmax.
- loglikelihood_rolling: a document's disjoint windows, lm-eval's own
  (utils.get_rolling_token_windows from the prefix token, context_len 1), as loglikelihood
  requests; the sum over them.
- generate_until: greedy (or seeded sampling where a temperature is asked) through
  infer/decoding.py's loop and the KV-cached forward pass (dtcli's GPT; another model's own
  forward pass over the window), each prompt left-truncated to leave room for max_gen_toks,
  stopped at the end-of-text/end-of-sequence ids and at the first `until` string, cut before it.

rank 0 of world size 1 always: on several clients each computes every request, in the same
order and batches (DTensor needs every client in each step); nothing goes through PyTorch.
lm_eval is an optional extra: this module imports it, so import it only where it is needed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

from dtcli import storage
from dtcli.data.document import encode_document
from dtcli.data.instructions import TextEncoder
from dtcli.data.tokenizer import ByteTokenizer
from dtcli.errors import UsageError
from dtcli.harness import requests as requests_lib
from dtcli.hf import tokenizer_files
from dtcli.infer import decoding

MAX_GEN_TOKS = 256  # lm-eval's default for a task that names none


class SessionLM(TemplateLM):
    """A language-model session (its weights in place) as lm-eval's `LM`. `batch_size`: rows of
    a loglikelihood batch (None: the recipe's data.eval_batch_size, else data.batch_size),
    rounded up to a multiple of the data axis. `run_dir`: the run directory the session's
    tokenizer.json came from, for its chat template and an imported model's end-of-sequence ids
    (None: no chat template; the tokenizer's end of text ends a generation)."""

    def __init__(self, session: Any, batch_size: int | None = None, *, run_dir: Path | None = None):
        super().__init__()
        self.session = session
        self.text_tokenizer = session.data.tokenizer
        if self.text_tokenizer is None:
            raise UsageError("lm-eval: the session is not a language model's (no tokenizer)")
        shape = tuple(session.data.input_shape)
        if len(shape) != 1:  # a training session's packed windows [3, context]
            raise UsageError(
                f"lm-eval: the model takes windows of shape {list(shape)} (packed instruction "
                "data); its tasks need one sequence of tokens a row"
            )
        self.context = int(shape[0])
        # dtcli's GPT takes windows shorter than the context (models.transformer.any_window)
        self.any_length = session.recipe.model.transformer is not None
        data = session.recipe.data
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"--batch-size {batch_size}: expected a positive integer")
        self.rows = requests_lib.rows_for(
            batch_size or data.eval_batch_size or data.batch_size, session.packer.shards
        )
        self.run_dir = run_dir
        found = None if run_dir is None else tokenizer_files.end_of_sequence_ids(run_dir)
        self.stop_ids = decoding.stop_ids(self.text_tokenizer.eot, found)
        self.vocab = session.recipe.model.real_vocab or self.text_tokenizer.vocab_size
        bos = () if isinstance(self.text_tokenizer, ByteTokenizer) else _bos(self.text_tokenizer)
        self.bos_id: int | None = bos[0] if len(bos) == 1 else None
        self._logprobs: Any = None
        self._forwards: dict[int, Any] = {}
        self.shapes_run: set[tuple[int, ...]] = set()  # the loglikelihood batches' shapes
        self._chat_template: Any = None  # the run's, read at the first request that asks
        self._end_of_turn: frozenset[int] | None = None  # its end-of-turn id, once rendered

    # --- tokens --------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int | None:
        return self.text_tokenizer.eot

    @property
    def prefix_token_id(self) -> int | None:
        """The BOS where the tokenizer has one, else its end of text (lm-eval's hf picks so)."""
        return self.bos_id if self.bos_id is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.context

    @property
    def max_gen_toks(self) -> int:
        return MAX_GEN_TOKS

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        """None or True: as `dtcli score` encodes a text (the post-processor's BOS), except a
        text that already starts with the BOS's text (as lm-eval's hf does); False: no special
        tokens."""
        tok = self.text_tokenizer
        if isinstance(tok, ByteTokenizer):
            return [int(i) for i in tok.encode(string.encode("utf-8"))]
        bos_text = None if self.bos_id is None else tok.tok.id_to_token(self.bos_id)
        if add_special_tokens is False or (
            add_special_tokens is None and bos_text and string.startswith(bos_text)
        ):
            return list(tok.tok.encode(string, add_special_tokens=False).ids)
        return [int(i) for i in encode_document(tok, string)[0]]

    def tok_decode(self, tokens: Any, **kwargs: Any) -> str:
        ids = [tokens] if isinstance(tokens, int) else [int(t) for t in tokens]
        return self.text_tokenizer.decode(ids).decode("utf-8", errors="replace")

    def _prefix(self, what: str) -> int:
        if self.prefix_token_id is None:
            raise UsageError(
                f"lm-eval: {what} needs a prefix token (a BOS or an end-of-text token) and this "
                f"run's tokenizer ({self.text_tokenizer.description}) has neither; train with "
                "one that has (data.tokenizer bpe:N adds an end-of-text token)"
            )
        return self.prefix_token_id

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        if any(req.args[0] == "" for req in requests):  # an empty context: the prefix token
            self._prefix("a loglikelihood request with an empty context")
        return super().loglikelihood(requests, disable_tqdm)

    # --- loglikelihood ---------------------------------------------------------------------

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log probabilities, whether each of its tokens is the
        model's argmax), per request, in request order."""
        from dtcli.infer.logprobs import TargetLogprobs

        if self._logprobs is None:
            self._logprobs = TargetLogprobs(self.session, self.any_length)
        cut = [requests_lib.scored(ctx, cont, self.max_length) for _, ctx, cont in requests]
        out: list[tuple[float, bool]] = [(0.0, True)] * len(cut)
        for group in requests_lib.batches(cut, self.rows):
            batch = [cut[i] for i in group]
            longest = max(request.length for request in batch)
            length = requests_lib.window_length(longest, self.context, self.any_length)
            inputs, targets, wanted = requests_lib.batch_arrays(batch, self.rows, length)
            self.shapes_run.add(inputs.shape)
            logprobs, greedy = self._logprobs(inputs, targets)
            for row, i in enumerate(group):
                at = wanted[row]
                total = float(np.sum(logprobs[row][at], dtype=np.float64))
                out[i] = (total, bool(greedy[row][at].all()))
                self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each document's log likelihood: the sum over lm-eval's disjoint rolling windows."""
        from lm_eval import utils

        prefix = self._prefix("loglikelihood_rolling (document perplexity)") if requests else 0
        windows, owners = [], []
        for index, req in enumerate(requests):
            rolling = utils.get_rolling_token_windows(
                token_list=self.tok_encode(req.args[0]),
                prefix_token=prefix,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owners.append(index)
        sums = np.zeros(len(requests), np.float64)
        for owner, (total, _) in zip(owners, self._loglikelihood_tokens(windows)):
            sums[owner] += total
        for req, total in zip(requests, sums):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, float(total))
        return [float(x) for x in sums]

    # --- generation ------------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's text, generated as `dtcli generate` does (greedy at temperature 0),
        cut before the first `until` string; requests with equal settings run together."""
        out: list[str] = [""] * len(requests)
        by_settings: dict[str, list[int]] = {}
        for index, req in enumerate(requests):
            settings = json.dumps(req.args[1], sort_keys=True, default=str)
            by_settings.setdefault(settings, []).append(index)
        for indices in by_settings.values():
            gen_kwargs = requests[indices[0]].args[1]
            for first in range(0, len(indices), self.rows):
                chunk = indices[first : first + self.rows]
                texts = self._generate([requests[i].args[0] for i in chunk], gen_kwargs, chunk)
                for i, text in zip(chunk, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _generate(self, contexts: list[str], gen_kwargs: dict, indices: list[int]) -> list[str]:
        eot = self.eot_token_id
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        until = handle_stop_sequences(
            kwargs.pop("until", None), None if eot is None else self.tok_decode([eot])
        )
        tokens = kwargs.pop("max_gen_toks")
        if not 0 < tokens < self.max_length:
            raise UsageError(
                f"lm-eval: max_gen_toks {tokens}: expected 1 to the model's context less one "
                f"({self.max_length - 1}), so that a prompt has room"
            )
        prompts = [
            requests_lib.generation_prompt(self.tok_encode(c), self.max_length, tokens)
            or [self._prefix("a generation with an empty prompt")]
            for c in contexts
        ]
        picker = _Picker(kwargs, self.vocab, indices)
        pieces = self.text_tokenizer.pieces()
        texts = [decoding.NewText(pieces, self.stop_ids) for _ in prompts]

        def ends(row: int, token: int) -> bool:
            texts[row].add(token)
            return any(stop and stop in texts[row].text for stop in until)

        forward = self._forward()
        if hasattr(forward, "reset"):
            forward.reset()
        for _ in decoding.run(
            prompts, forward, self.context, tokens, self.rows, picker.pick, self.stop_ids, ends
        ):
            pass
        return [requests_lib.cut_at_stop(t.whole(), until) for t in texts]

    def _forward(self) -> Any:
        """The KV-cached forward pass for dtcli's GPT, else the model's own over each window;
        made once for the session's rows and kept."""
        from dtcli.infer import forward

        if self.rows not in self._forwards:
            cached = self.session.recipe.model.transformer is not None
            self._forwards[self.rows] = (
                forward.CachedForward(self.session, self.rows)
                if cached
                else forward.WindowForward(self.session)
            )
        return self._forwards[self.rows]

    # --- chat templates --------------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return f"dtcli-{self.session.recipe.name}".replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        if chat_template is False or chat_template is None:
            return None
        return self._template().source

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The conversation rendered with the run's chat template (as generate --chat). From
        then on a generation also stops at the template's end of turn (<|im_end|>, <|eot_id|>),
        which its text leaves out, as generate --chat's answers do."""
        template = self._template()
        if self._end_of_turn is None:  # once: lm-eval renders every request
            token = template.end_of_turn()
            single = None if token is None else TextEncoder(self.text_tokenizer).single_id(token)
            self._end_of_turn = frozenset(() if single is None else (single,))
            self.stop_ids = self.stop_ids | self._end_of_turn
        return template.render(chat_history, add_generation_prompt=add_generation_prompt)

    def _template(self) -> Any:
        if self._chat_template is None:
            self._chat_template = self._read_template()
        return self._chat_template

    def _read_template(self) -> Any:
        from dtcli.data import jsonl
        from dtcli.rundir.files import TOKENIZER

        recipe = self.session.recipe
        check_chat_template(recipe, self.run_dir)
        saved = None if self.run_dir is None else storage.as_path(self.run_dir) / TOKENIZER
        cfg = recipe.data
        if cfg.source != "jsonl":  # only the run's kept files, as generate --chat reads them
            cfg = dataclasses.replace(cfg, tokenizer=None)
        return jsonl.template(cfg, saved, self.text_tokenizer)


def check_chat_template(recipe: Any, run_dir: Path | None) -> None:
    """--apply-chat-template needs the run's chat template: its instruction data's (data.source
    jsonl), or the tokenizer_config.json the run keeps in RUN_DIR/hf (an imported model's).
    Reads files only: `dtcli eval` checks it before any weight is restored."""
    from dtcli.data import chat

    if recipe.data.source == "jsonl":
        return
    kept = None if run_dir is None else storage.as_path(run_dir) / tokenizer_files.FOLDER
    if kept is None or not chat.beside([kept]):
        raise UsageError(
            "--apply-chat-template: this run was trained without instruction data (data."
            f"source {recipe.data.source}) and keeps no chat template (no chat_template in "
            "RUN_DIR/hf/tokenizer_config.json); evaluate without it, or a run fine-tuned on "
            "instruction data (data.source: jsonl) or imported with a chat template"
        )


def _bos(tokenizer: Any) -> tuple[int, ...]:
    return TextEncoder(tokenizer).bos_ids


class _Picker:
    """A request's next token: the argmax at temperature 0 (the tokenizer's ids only), else a
    draw from its own host RNG seeded with (0, the request's index), as generate seeds one."""

    def __init__(self, kwargs: dict, vocab: int, indices: list[int]):
        self.temperature = float(kwargs.get("temperature") or 0.0) if kwargs["do_sample"] else 0.0
        self.top_k = kwargs.get("top_k")
        self.top_p = kwargs.get("top_p")
        self.vocab = vocab
        self.rngs = [np.random.default_rng([0, i]) for i in indices]

    def pick(self, row: int, logits: np.ndarray) -> int:
        return decoding.pick(
            logits, self.temperature, self.top_k, self.rngs[row], self.vocab, self.top_p
        )
