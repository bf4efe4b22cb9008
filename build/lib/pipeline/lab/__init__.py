"""The measuring lab: what the pages measure beside the pipeline itself. The roofline and the hardware probes,
attention-kernel experiments, tensor-parallel sharding plans, the misconception experiments and the cross-checks
that show each page's numbers are right."""
