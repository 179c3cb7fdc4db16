"""The GPU tree-attention path: a Triton kernel over vLLM's CUDA paged KV layout (`tree_kernel`) and its plain-torch
reference (`reference`). Nothing is imported here, so loading the package costs nothing on a platform without Triton.
"""
