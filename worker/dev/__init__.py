"""Development tools: the provider sandbox, the in-process harness and the demo."""
