"""The decode step's GPU sub-room: torch.compile and CUDA-graph capture of a fixed-shape step (graphs), and the step trimmed to four Triton kernels a layer (triton_step, triton_kernels)."""
