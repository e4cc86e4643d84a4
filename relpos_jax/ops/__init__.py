"""Hardware-specific speed work behind a narrow door: 16-bit precision helpers, the dropout hash,
host-memory limits and CPU device layout. Model code calls these; nothing here knows a scheme."""
