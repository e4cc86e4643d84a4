"""Reading trained models, never changing them: RECL, memory probes, plots, the demo, and bootstrap
intervals of their scores."""
