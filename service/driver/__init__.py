"""The driver: the composition root, its background components, HTTP and metrics."""
