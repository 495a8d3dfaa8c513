# Extract: vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py of vLLM main at
# commit 029a811ebaf31b8ee03422af193179bc93d5fefd; the hooked names and parameter lists only.


class TargetDependentARSpeculator:
    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync=None,
        dummy_run=False,
        skip_attn_for_dummy_run=False,
        mm_inputs=None,
        is_profile=False,
        num_speculative_tokens=None,
    ): ...
