"""What every floor measures with: per-object memos that die with their object (memo), clocks and the server's
activity record (timing), and the hardware sampler (telemetry)."""
