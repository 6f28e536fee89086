"""What the tests share, each module named after what it holds; test modules import from here,
never from one another (docs/testing.md, "Shared test code")."""
