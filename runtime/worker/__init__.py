"""What every Ray Train worker runs: the loop (``trainer``) and its optimizer step, eager or
replayed as a CUDA graph (``step``)."""
