"""What every Ray Train worker runs: the loop (``trainer``), its optimizer step, eager or
replayed as a CUDA graph (``step``), the train state and its checkpoints (``state``), and the
RNG streams a checkpoint carries (``rng``)."""
