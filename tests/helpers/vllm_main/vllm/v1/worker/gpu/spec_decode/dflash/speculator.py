# Extract: vllm/v1/worker/gpu/spec_decode/dflash/speculator.py of vLLM main at commit
# 00746147f8cf4b7715d9cdc591d5dd6f4d12b27f; the hooked names and parameter lists only. At
# this commit the class has no _aux_staging, _store_hidden_states or _prepare_graph_forward:
# propose combines torch.cat(aux_hidden_states, dim=-1) eagerly.


class DFlashSpeculator:
    def capture(self): ...

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
    ): ...
