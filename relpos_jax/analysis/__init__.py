"""Reading trained models, never changing them: RECL, memory probes, plots, and the demo."""
