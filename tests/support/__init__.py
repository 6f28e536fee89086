"""What the tests share, each module named after what it holds (docs/testing.md, "Shared test
code"). Test modules import from here, never from one another."""
