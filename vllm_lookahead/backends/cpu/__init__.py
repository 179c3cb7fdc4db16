"""vLLM's CPU attention (CPU_ATTN): its KV-cache layouts (`layouts`), the tree rows in plain torch (`reference`) and
through the compiled library (`csrc/`, built by `kernel`, loaded by `library`; `plan`), KV relocation (`relocation`)
and logits rows' argmax and top tokens (`logit_rows`), behind `backend`."""
