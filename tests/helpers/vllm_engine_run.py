"""One vLLM engine run for ``test_vllm_engine.py``, in a process of its own.

    python tests/helpers/vllm_engine_run.py TARGET DRAFT PROMPTS_JSON OUT_JSON [--eager]

Runs the engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the plugin's
counters read here are the engine's. Generates greedily from the prompts' token ids with
an EAGLE-3 draft and writes: the tokens and their logprobs, the plugin's counters, the
BF16 concatenations of the drafter's input width that were allocated during generation,
and vLLM's speculative-decoding counters.
"""

from __future__ import annotations

import json
import sys

import torch


def _count_concatenations(width: int):
    """Wrap ``torch.cat``: count BF16 / FP16 results ``[tokens, width]`` whose memory holds
    them all (FP32 ones are the W8A16 reference's working chunks, not vLLM's concatenation)."""
    counts = {"allocated": 0}
    original = torch.cat

    def cat(*args, **kwargs):
        out = original(*args, **kwargs)
        if (
            isinstance(out, torch.Tensor)
            and out.dtype in (torch.bfloat16, torch.float16)
            and out.dim() == 2
            and out.shape[1] == width
        ):
            if out.untyped_storage().nbytes() >= out.numel() * out.element_size() > 0:
                counts["allocated"] += 1
        return out

    return counts, cat, original


def _spec_counters(llm) -> dict[str, float]:
    wanted = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    found = {}
    for metric in llm.get_metrics():
        for key in wanted:
            if metric.name == f"vllm:spec_decode_{key}":
                found[key] = getattr(metric, "value", None)
    return found


def main(argv: list[str]) -> None:
    from vllm import LLM, SamplingParams

    from mxfp8_fusion.vllm import settings

    target, draft, prompts_path, out_path = argv[:4]
    eager = "--eager" in argv
    prompts = json.loads(open(prompts_path).read())
    llm = LLM(
        model=target,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        enforce_eager=eager,
        seed=0,
        disable_log_stats=False,
        speculative_config={"method": "eagle3", "model": draft, "num_speculative_tokens": 2},
    )
    params = SamplingParams(temperature=0.0, max_tokens=prompts["max_tokens"], logprobs=0)
    counts, counting_cat, original_cat = _count_concatenations(prompts["fc_in_features"])
    torch.cat = counting_cat
    try:
        outputs = llm.generate(
            [{"prompt_token_ids": ids} for ids in prompts["token_ids"]], params, use_tqdm=False
        )
    finally:
        torch.cat = original_cat
    results = []
    for output in outputs:
        completion = output.outputs[0]
        logprobs = [
            step[token].logprob
            for token, step in zip(completion.token_ids, completion.logprobs, strict=True)
        ]
        results.append({"token_ids": list(completion.token_ids), "logprobs": logprobs})
    stats = settings.stats
    report = {
        "outputs": results,
        "plugin": {
            "registered": stats.registered,
            "parts": list(stats.parts),
            "layers": stats.layers,
            "w8a16_layers": stats.w8a16_layers,
            "linear_calls": stats.linear_calls,
            "pass_graphs": stats.pass_graphs,
            "pass_linear_nodes": stats.pass_linear_nodes,
            "pass_rewrites": stats.pass_rewrites,
            "staged_steps": stats.staged_steps,
            "slice_steps": stats.slice_steps,
            "unstaged_concatenations": stats.unstaged_concatenations,
        },
        "allocated_concatenations": counts["allocated"],
        "spec_decode": _spec_counters(llm),
    }
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
