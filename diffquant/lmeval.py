"""lm-evaluation-harness adapter (optional extra ``diffquant[lmeval]``): any lm-eval task runs on a diffquant model.

``DiffquantLM`` is a ``lm_eval.api.model.TemplateLM`` whose scoring is :mod:`diffquant.evaluate`'s, so numbers
match ``diffquant sweep`` and ``evaluate_task`` exactly:

* ``loglikelihood``: :func:`~diffquant.evaluate.encode_pair` (lm-eval's ``_encode_pair``, plus BOS before the
  context when ``bos=True``, the default, because the project's models are trained with BOS before every
  document; ``bos=False`` is lm-eval's own tokenisation) and :func:`~diffquant.evaluate.score_requests`;
* ``loglikelihood_rolling``: lm-eval's disjoint rolling windows of ``max_length`` tokens after the prefix token
  (:func:`~diffquant.evaluate.rolling_requests`);
* ``generate_until``: greedy decoding without a KV cache (:func:`~diffquant.generate.greedy_generate`), cut at
  the first stop string; sampling is refused.

lm_eval is imported only when the class is first used, so ``import diffquant.lmeval`` works without it::

    from diffquant.lmeval import DiffquantLM
    import lm_eval
    lm = DiffquantLM(pretrained="runs/small-diff/final", quant='{"logits": {"bits": 4}}', batch_size=16)
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"], limit=100)

:func:`register` adds the name ``diffquant`` to lm-eval's model registry, for code that picks models by name:
``simple_evaluate(model="diffquant", model_args="pretrained=runs/small-diff/final,batch_size=16", ...)``.

From the command line: lm-eval (0.4.x) finds models only in its own registry (no plugin entry points), so a
bare ``lm_eval --model diffquant`` cannot see this package. ``python -m diffquant.lmeval ARGS`` is lm-eval's
command line with ``diffquant`` registered first; every argument is lm-eval's own::

    python -m diffquant.lmeval --model diffquant --model_args pretrained=runs/small-diff/final \
        --batch_size 16 --tasks diffquant_hellaswag --limit 100

Quantization in ``--model_args`` as key=value pairs lm-eval's parser carries: ``weights=rtn|gptq``, ``wbits``,
``group_size``, ``logit_bits``, ``logit_granularity``, ``act_bits``, ``act_granularity`` (or ``quant=`` a JSON
file). The tasks ``diffquant_hellaswag``, ``diffquant_arc_easy``, ``diffquant_piqa``, ``diffquant_boolq``,
``diffquant_openbookqa`` and ``diffquant_copa`` read the sets shipped under ``calib/eval`` (no download; folder
:data:`TASKS_DIR`, passed as ``--include_path`` unless one is given). A bad argument is one line on stderr, exit 2.

``--batch_size`` and ``--device`` are lm-eval's own flags there (lm-eval refuses them again in ``--model_args``);
its default device ``cuda:0`` falls back to the CPU where CUDA is missing, as lm-eval's ``hf`` model does.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from .calibration import DEFAULT_CALIB_TOKENS

log = logging.getLogger(__name__)

__all__ = ["lm_class", "main", "register"]  # and DiffquantLM, built on first access (module __getattr__)

REGISTERED_NAME = "diffquant"
TASKS_DIR = Path(__file__).resolve().parent / "lmeval_tasks"  # lm-eval task YAMLs of the shipped eval sets
QUANT_ARGS = ("weights", "wbits", "group_size", "logit_bits", "logit_granularity", "act_bits", "act_granularity")
GENERATE_STEP = 16  # tokens generated between checks for a stop string
_CLASS = None


def _import_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.api.model import TemplateLM
    except ImportError as exc:
        raise ImportError("the lm-eval adapter needs lm-eval: pip install 'diffquant[lmeval]'") from exc
    return TemplateLM


def lm_class():
    """The ``TemplateLM`` subclass, built on first use (lm_eval is optional)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build(_import_lm_eval())
    return _CLASS


def register(name: str = REGISTERED_NAME):
    """Register the adapter with lm-eval's model registry as ``name`` (``--model diffquant``); idempotent."""
    cls = lm_class()  # a clear ImportError without lm-eval
    from lm_eval.api import registry

    try:  # lm-eval fills its registry with its own models only while it is empty: let it do so first
        import lm_eval.models  # noqa: F401
    except ImportError:  # pragma: no cover - an lm-eval without a models package
        pass
    if registry.MODEL_REGISTRY.get(name, None) is not cls:
        registry.register_model(name)(cls)
    return cls


def main(argv: list[str] | None = None) -> int:
    """``python -m diffquant.lmeval ARGS``: lm-eval's command line (``lm_eval ARGS``) with ``diffquant`` registered.

    Returns lm-eval's exit status; without lm-eval installed, one line on stderr and 2.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        register()
    except ImportError as exc:
        sys.stderr.write(f"diffquant.lmeval: error: {exc}\n")
        return 2
    if not any(a.startswith("--include_path") for a in argv) and any(a.startswith("--tasks") for a in argv):
        argv += ["--include_path", str(TASKS_DIR)]
    saved = sys.argv
    sys.argv = ["lm_eval", *argv]  # lm-eval's parser reads sys.argv itself
    try:
        _run_lm_eval()
    except SystemExit as exc:  # argparse and lm-eval exit this way
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (ValueError, TypeError, OSError) as exc:  # bad --model_args and the like: one line, no traceback
        from .errors import first_line

        sys.stderr.write(f"diffquant.lmeval: error: {first_line(exc)}\n")
        return 2
    finally:
        sys.argv = saved
    return 0


def __getattr__(name: str):
    if name == "DiffquantLM":
        return lm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _quant_config(quant: str):
    """lm-eval's ``quant=`` argument: JSON text, or else the path of a JSON file the user named."""
    from .quant import QuantConfig

    text = quant.lstrip()
    return QuantConfig.from_json_text(text) if text.startswith("{") else QuantConfig.from_json_file(quant)


def quant_from_args(quant=None, weights=None, wbits=None, group_size=None, logit_bits=None,
                    logit_granularity=None, act_bits=None, act_granularity=None):
    """The QuantConfig of ``--model_args``: ``quant=`` (a QuantConfig, JSON text or a JSON file) or the key=value
    pairs (``weights=gptq,wbits=4,group_size=32,logit_bits=4``); None when nothing is quantized."""
    from .quant import ActQuant, QuantConfig, WeightQuant

    pairs = {"weights": weights, "wbits": wbits, "group_size": group_size, "logit_bits": logit_bits,
             "logit_granularity": logit_granularity, "act_bits": act_bits, "act_granularity": act_granularity}
    given = {k: v for k, v in pairs.items() if v not in (None, "")}
    if quant not in (None, "") and given:
        raise ValueError(f"give quant= or {', '.join(given)}, not both")
    if quant not in (None, ""):
        return quant if isinstance(quant, QuantConfig) else _quant_config(str(quant))
    if not given:
        return None
    if (weights is None) != (wbits is None) or (group_size is not None and weights is None):
        raise ValueError("weights= and wbits= go together (weights=rtn|gptq,wbits=4[,group_size=G])")
    if logit_granularity is not None and logit_bits is None or act_granularity is not None and act_bits is None:
        raise ValueError("logit_granularity needs logit_bits, act_granularity needs act_bits")
    return QuantConfig(
        weights=None if weights is None else WeightQuant(str(weights), _as_int(wbits, "wbits", 0),
                                                         None if group_size is None else
                                                         _as_int(group_size, "group_size", 0)),
        logits=None if logit_bits is None else ActQuant(_as_int(logit_bits, "logit_bits", 0),
                                                        logit_granularity or "sequence"),
        activations=None if act_bits is None else ActQuant(_as_int(act_bits, "act_bits", 0),
                                                           act_granularity or "token"))


def _load_model(pretrained, quant, device: str, calib_tokens: int, seed: int, tokenizer=None):
    """A diffquant model from a checkpoint path (or as given), quantized when ``quant`` says so."""
    import torch

    from .checkpoint import load_checkpoint
    from .quant import quantize_model

    model = load_checkpoint(pretrained, device=device) if isinstance(pretrained, (str, os.PathLike)) else pretrained
    if quant is None:
        return model
    config = quant
    calib = None
    if config.weights is not None and config.weights.handler.needs_calibration:
        from .calibration import calibration_batch
        from .evaluate import model_max_len
        from .tokenizer import tokenizer_for

        if not isinstance(pretrained, (str, os.PathLike)):
            raise ValueError(f"{config.weights.handler.title} through the adapter needs a checkpoint path (for its "
                             "tokenizer and calibration)")
        calib = calibration_batch(tokenizer_for(pretrained, tokenizer), model_max_len(model), calib_tokens, seed)
        calib = calib.to(next(model.parameters()).device, dtype=torch.long)
    return quantize_model(model, config, calib=calib)


def _checked_quant(pretrained, quant, quant_args: dict):
    """The QuantConfig of DiffquantLM's arguments (None: unquantized), or a ValueError naming what is wrong with them.

    ``quant_args`` are the arguments beyond DiffquantLM's named ones: only :data:`QUANT_ARGS` may be among them.
    """
    if pretrained is None:
        raise ValueError("DiffquantLM needs pretrained= (a checkpoint path or a model)")
    unknown = sorted(set(quant_args) - set(QUANT_ARGS))
    if unknown:
        raise ValueError(f"unknown model_args {', '.join(unknown)}; DiffquantLM takes pretrained, tokenizer, "
                         f"quant, {', '.join(QUANT_ARGS)}, bos, max_length, calib_tokens, seed")
    return quant_from_args(quant, **quant_args)


def _check_model_args(model_args: dict) -> None:
    """``--model diffquant``'s ``--model_args`` checked as DiffquantLM will check them: lm-eval builds the model only
    after indexing its ~14K task files (15–40 s here), so a typo would otherwise cost that long to report."""
    import inspect

    named = set(inspect.signature(lm_class().__init__).parameters) - {"self", "kwargs"}
    rest = {k: v for k, v in model_args.items() if k not in named}
    _checked_quant(model_args.get("pretrained"), model_args.get("quant"), rest)


def _run_lm_eval() -> None:
    """lm-eval's command line on ``sys.argv``, with ``--model diffquant``'s arguments checked before its task index."""
    try:  # lm-eval's HarnessCLI command line; an older lm-eval runs unchecked, as it always did
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:  # pragma: no cover - older lm-eval
        from lm_eval.__main__ import cli_evaluate

        return cli_evaluate()
    setup_logging()
    parser = HarnessCLI()
    args = parser.parse_args()
    if getattr(args, "model", None) == REGISTERED_NAME:
        _check_model_args(args.model_args or {})
    parser.execute(args)


def _as_int(value, name: str, default: int) -> int:
    """lm-eval passes command-line values as strings (and ``batch_size="auto"``)."""
    if value is None or value == "auto":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _device(device) -> str:
    """The device to load on: a CUDA device where CUDA is missing (lm-eval's CLI default) becomes the CPU."""
    import torch

    device = "cpu" if device is None else str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("CUDA is not available: running on the CPU instead of %s", device)
        return "cpu"
    return device


def _as_bool(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")


def _build(TemplateLM):
    from .evaluate import encode_pair, model_max_len, rolling_requests, score_requests
    from .tokenizer import Tokenizer, tokenizer_for

    class DiffquantLM(TemplateLM):
        """A diffquant model (checkpoint path or module, optionally quantized) as an lm-eval ``TemplateLM``.

        pretrained: checkpoint folder / ``.gguf`` path, or a model (then pass ``tokenizer``).
        tokenizer: a :class:`~diffquant.tokenizer.Tokenizer` or its file; default the checkpoint's own.
        quant: a ``QuantConfig``, its JSON text or a JSON file; GPTQ calibrates on ``calib_tokens`` tokens of
            the train split.
        bos: put BOS before every context (the project's training format); False = lm-eval's tokenisation.
        """

        def __init__(self, pretrained=None, tokenizer=None, quant=None, batch_size=8, device="cpu", bos=True,
                     max_length=None, calib_tokens=DEFAULT_CALIB_TOKENS, seed=0, max_batch_size=None, **kwargs):
            super().__init__()
            config = _checked_quant(pretrained, quant, kwargs)
            device = _device(device)
            calib_tokens = _as_int(calib_tokens, "calib_tokens", DEFAULT_CALIB_TOKENS)
            if isinstance(pretrained, (str, os.PathLike)):  # refuses a model without a tokenizer that fits it
                self.tok = tokenizer_for(Path(pretrained), tokenizer)
            elif isinstance(tokenizer, Tokenizer) or tokenizer is not None:
                self.tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
            else:
                raise ValueError("pass tokenizer= with a model object")
            self.model = _load_model(pretrained, config, device, calib_tokens,
                                     _as_int(seed, "seed", 0), self.tok).eval()
            self.batch_size = _as_int(batch_size, "batch_size", 8)
            self.max_length = _as_int(max_length, "max_length", model_max_len(self.model))
            self.bos = _as_bool(bos)
            self._device = device

        # --- tokenizer
        @property
        def eot_token_id(self) -> int:
            eot = self.tok.eos_id if self.tok.eos_id is not None else self.tok.bos_id
            if eot is None:
                raise ValueError("the tokenizer has neither an EOS nor a BOS token")
            return eot

        @property
        def prefix_token_id(self) -> int:
            return self.tok.bos_id if self.tok.bos_id is not None else self.eot_token_id

        def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
            return self.tok.encode(string)

        def tok_decode(self, tokens, **kwargs) -> str:
            return self.tok.decode(tokens)

        # --- scoring
        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            scores = score_requests(self.model, [(ctx, cont) for _, ctx, cont in requests], self.batch_size,
                                    self.max_length, progress=not disable_tqdm, desc="loglikelihood")
            return [(s["ll"], s["greedy"]) for s in scores]

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            pairs = [req.args for req in requests]
            encoded = [(pair, *encode_pair(self.tok, pair[0], pair[1], bos=self.bos)) for pair in pairs]
            results = self._loglikelihood_tokens(encoded, disable_tqdm=disable_tqdm)
            for pair, result in zip(pairs, results, strict=True):
                self.cache_hook.add_partial("loglikelihood", pair, result)
            return results

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            flat, owners = [], []
            for k, req in enumerate(requests):
                ids = self.tok.encode(req.args[0])
                if ids:
                    windows = rolling_requests([self.prefix_token_id, *ids], self.max_length)
                    flat += windows
                    owners += [k] * len(windows)
            scores = score_requests(self.model, flat, self.batch_size, self.max_length, progress=not disable_tqdm,
                                    desc="loglikelihood_rolling") if flat else []
            totals = [0.0] * len(requests)
            for k, s in zip(owners, scores, strict=True):
                totals[k] += s["ll"]
            for req, total in zip(requests, totals, strict=True):
                self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
            return totals

        def generate_until(self, requests, disable_tqdm: bool = False):
            return [self._generate(*req.args) for req in requests]

        def _generate(self, context: str, gen_kwargs: dict) -> str:
            import torch

            from .generate import greedy_generate

            kwargs = dict(gen_kwargs or {})
            if _as_bool(kwargs.get("do_sample", False)) or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError("DiffquantLM generates greedily only (do_sample=False, temperature=0)")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = _as_int(kwargs.get("max_gen_toks"), "max_gen_toks", 256)
            prompt = ([self.prefix_token_id] if self.bos else []) + self.tok.encode(context)
            ids = torch.tensor([prompt or [self.prefix_token_id]], device=next(self.model.parameters()).device)
            start, text = ids.shape[1], ""
            while ids.shape[1] - start < max_new:
                step = min(GENERATE_STEP, max_new - (ids.shape[1] - start))
                ids = greedy_generate(self.model, ids, step, eos_id=self.eot_token_id)
                new = ids[0, start:].tolist()
                stopped = self.eot_token_id in new
                text = self.tok.decode(new[:new.index(self.eot_token_id)] if stopped else new)
                if stopped or any(s in text for s in until):
                    break
            for s in until:
                text = text.split(s)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            return text

    return DiffquantLM


if __name__ == "__main__":  # run the imported module's main: one DiffquantLM class, not a second one in __main__
    from diffquant.lmeval import main as _main

    sys.exit(_main())
