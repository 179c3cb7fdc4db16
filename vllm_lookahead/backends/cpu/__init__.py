"""vLLM's CPU attention (CPU_ATTN): its KV-cache layouts (`layouts`), the tree rows in plain torch (`reference`) and
through the compiled kernel (`kernel`, `plan`, `csrc/`), KV relocation (`relocation`), behind `backend`."""
