"""GPTQModel on the stories260K HF folder written by bench_gptq.py --gptqmodel: run inside GPTQModel's own venv.

    python experiments/gptqmodel_run.py DIR [THREADS]   (DIR holds hf/, calib.pt, eval.pt; prints one JSON line)

Settings as in issue 16: 4 bits, per channel (group_size -1), symmetric, desc_act=False, act_group_aware=False
(7.7 turns it on by default, and refuses it with group_size -1), damp_percent 0.05, true_sequential.
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def perplexity(model, x, y) -> float:
    with torch.inference_mode():
        nll = torch.cat([F.cross_entropy(model(input_ids=xb).logits.double().flatten(0, 1), yb.flatten(),
                                         reduction="none") for xb, yb in zip(x.split(16), y.split(16), strict=True)])
    return float(torch.exp(nll.mean()))


def main() -> None:
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.quantization.gptq import GPTQ
    from transformers import LlamaForCausalLM

    weights = {}  # module name -> GPTQModel's dequantized weight (what its packed checkpoint encodes)
    real = GPTQ.quantize

    def capture(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        weights[self._named_module.full_name] = out[0].detach().float().clone()
        return out

    GPTQ.quantize = capture

    folder = Path(sys.argv[1])
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    calib, (x, y) = torch.load(folder / "calib.pt"), torch.load(folder / "eval.pt")
    hf = LlamaForCausalLM.from_pretrained(folder / "hf", torch_dtype=torch.float32).eval()
    fp32 = perplexity(hf, x, y)
    qcfg = QuantizeConfig(bits=4, group_size=-1, sym=True, desc_act=False, act_group_aware=False,
                          damp_percent=0.05, true_sequential=True)
    model = GPTQModel.load(str(folder / "hf"), qcfg, device="cpu", torch_dtype=torch.float32)
    rows = [{"input_ids": r.tolist(), "attention_mask": [1] * len(r)} for r in calib]
    start = time.perf_counter()
    model.quantize(rows, batch_size=8)
    seconds = time.perf_counter() - start
    # Its CPU kernels need widths divisible by 16 (ffn 172 is not) or fp16: evaluate its dequantized weights in
    # float32, as diffquant evaluates its own.
    with torch.no_grad():
        for name, w in weights.items():
            hf.get_submodule(name).weight.copy_(w.reshape(hf.get_submodule(name).weight.shape))
    print(json.dumps({"gptqmodel_fp32_ppl": fp32, "gptqmodel_ppl": perplexity(hf, x, y), "gptqmodel_seconds": seconds,
                      "layers": len(weights), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
