"""Chart functions (PNG and SVG) drawn from result tables; the tasks decide which to draw."""
