"""lm-eval, second pass: quantization as key=value --model_args that lm-eval's own parser carries, bad model_args
refused in one line, and task YAMLs for the shipped evaluation sets whose lm-eval scores equal evaluate_task's."""

import pytest
import torch

import diffquant as dq
from diffquant.evaluate import evaluate_task
from diffquant.quant import ActQuant, QuantConfig, WeightQuant, quantize_model

from .conftest import tiny_config
from .helpers import randomize_

lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize_(dq.build_model(tiny_config("diff", vocab_size=8192, max_seq_len=64)))
    return str(dq.save_checkpoint(model, tmp_path_factory.mktemp("lmeval") / "tiny-diff"))


@pytest.fixture(autouse=True)
def _fresh_log_handlers():
    """lm-eval's CLI adds log handlers on the stream capsys swaps per test: drop them after each test."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("lm_eval")]
    saved = [list(lg.handlers) for lg in loggers]
    yield
    for lg, handlers in zip(loggers, saved, strict=True):
        lg.handlers = handlers


def _instances(args_list):
    from lm_eval.api.instance import Instance

    return [Instance("loglikelihood", {}, args, i) for i, args in enumerate(args_list)]


def test_key_value_quantization_through_lm_evals_own_parser(ckpt):
    from diffquant.lmeval import lm_class

    lm = lm_class().create_from_arg_string(f"pretrained={ckpt},weights=rtn,wbits=4,group_size=16,logit_bits=4",
                                           {"batch_size": 4})
    reference = quantize_model(dq.load_checkpoint(ckpt), QuantConfig(weights=WeightQuant("rtn", 4, 16),
                                                                     logits=ActQuant(4, "sequence")))
    ids = torch.randint(0, 8192, (2, 24))
    assert torch.equal(lm.model(ids), reference(ids))
    plain = lm_class().create_from_arg_string(f"pretrained={ckpt}", {"batch_size": 4})
    reqs = _instances([("Once upon a time", " there was a cat.")])
    assert lm.loglikelihood(reqs, disable_tqdm=True) != plain.loglikelihood(reqs, disable_tqdm=True)


@pytest.mark.parametrize("args, needle", [
    ("foo=1", "unknown model_args foo"),
    ("weights=rtn", "go together"),
    ("wbits=4", "go together"),
    ("logit_granularity=head", "needs logit_bits"),
    ("weights=rtn,wbits=4,quant=q.json", "not both"),
    ("weights=awq,wbits=4", "awq"),
])
def test_bad_model_args_are_one_line_and_exit_2(ckpt, capsys, monkeypatch, args, needle):
    from lm_eval.tasks.manager import TaskManager

    from diffquant.lmeval import main

    def index_tasks(*args, **kwargs):  # refused before lm-eval indexes its task files (15-40 s here)
        raise AssertionError("lm-eval indexed its tasks before the model_args were checked")

    monkeypatch.setattr(TaskManager, "__init__", index_tasks)
    assert main(["--model", "diffquant", "--model_args", f"pretrained={ckpt},{args}", "--tasks", "diffquant_copa",
                 "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("diffquant.lmeval: error:"), err
    assert needle in err.strip().splitlines()[-1]


@pytest.mark.parametrize("task, limit", [("copa", 12), ("hellaswag", 6), ("arc_easy", 6)])
def test_shipped_task_yamls_score_as_evaluate_task(ckpt, monkeypatch, task, limit):
    from lm_eval.tasks import TaskManager

    from diffquant.lmeval import TASKS_DIR, lm_class

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = lm_class()(pretrained=ckpt, batch_size=4)
    result = lm_eval.simple_evaluate(model=lm, tasks=[f"diffquant_{task}"], limit=limit,
                                     task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False))
    got = result["results"][f"diffquant_{task}"]
    ours = evaluate_task(lm.model, lm.tok, task, limit=limit, progress=False)
    assert got["acc,none"] == pytest.approx(ours["acc"], abs=1e-12)
    assert got["acc_norm,none"] == pytest.approx(ours["acc_norm"], abs=1e-12)
